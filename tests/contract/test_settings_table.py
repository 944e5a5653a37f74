"""The one table of environment variables (docs/CONFIGURATION.md) is generated from the settings
classes and `OTHER_VARIABLES`; it fails here when the docs, the code, or a variable the sources read
drift apart (like the committed JSON Schemas and AsyncAPI documents)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import Field

from ckpt_ha.cli import settings_table
from ckpt_ha.runtime.settings import ServiceSettings

SOURCES = Path(settings_table.__file__).resolve().parents[1]
TEST_ONLY = frozenset({"CKPT_HA_TEST_PROBE_NATS_PORT", "CKPT_HA_TEST_PROBE_REDIS_PORT"})
"""Read by the test infrastructure only (`ckpt_ha.lab.devstack.testinfra`), never by a
deployment."""


def test_the_docs_table_matches_the_settings_classes() -> None:
    assert settings_table.main(["--check"]) == 0, "run: python -m ckpt_ha.cli.settings_table"


def test_every_variable_named_in_the_sources_is_in_the_table() -> None:
    table = settings_table.render()
    named = {
        m.group(1).rstrip("_")
        for path in SOURCES.rglob("*.py")
        for m in re.finditer(r"[\"'$](CKPT_HA_[A-Z0-9_]+)", path.read_text())
    }
    documented = set(re.findall(r"`(CKPT_HA_[A-Z0-9_]+)", table))
    missing = sorted(named - TEST_ONLY - documented)
    assert not missing, f"add to the settings table (OTHER_VARIABLES or a field): {missing}"


def test_a_field_without_a_docstring_cannot_be_tabled(monkeypatch: pytest.MonkeyPatch) -> None:
    class Undocumented(ServiceSettings):
        mystery_s: float = Field(default=1.0)

    monkeypatch.setattr(settings_table, "RunnerSettings", Undocumented)
    with pytest.raises(ValueError, match=r"Undocumented.mystery_s has no docstring"):
        settings_table.render()


def test_a_changed_default_shows_as_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    field = ServiceSettings.model_fields["fetch_batch"]
    monkeypatch.setattr(field, "default", 65)
    assert "| `CKPT_HA_FETCH_BATCH` | `65` |" in settings_table.render()
    assert settings_table.main(["--check"]) == 1
