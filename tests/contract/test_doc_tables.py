"""The tables of docs/ that mirror code (CLI, events, metrics, alerts, settings) are generated
from what the code holds at run time; they fail here when the committed docs and the code drift
apart (like the committed JSON Schemas). Regenerate with ``python -m ckpt_ha.cli.doc_tables``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram

from ckpt_ha.assets import asset
from ckpt_ha.cli import doc_tables
from ckpt_ha.contracts import CATALOG

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(doc_tables.TABLES))
def test_the_committed_table_matches_the_code(name: str) -> None:
    assert doc_tables.main(["--check", name]) == 0, "run: python -m ckpt_ha.cli.doc_tables"


@pytest.mark.parametrize("name", sorted(doc_tables.TABLES))
def test_a_change_in_the_code_shows_as_drift(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    table = doc_tables.TABLES[name]
    changed = table.render().replace("\n\n<!-- end", "\n| a row the code grew | |\n\n<!-- end")
    monkeypatch.setitem(
        doc_tables.TABLES, name, doc_tables.Table(name, table.path, lambda: changed)
    )
    assert doc_tables.main(["--check", name]) == 1
    assert f"{table.path.relative_to(ROOT)}: {name} drifted" in capsys.readouterr().err


def rows(name: str) -> list[str]:
    rendered = doc_tables.TABLES[name].render()
    return [line for line in rendered.splitlines() if line.startswith("| ")][2:]


def test_every_alert_rule_has_a_row_linking_its_runbook_section() -> None:
    rules = yaml.safe_load(asset("observability", "alerts.yml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    table = rows("alerts-table")
    assert len(table) == len(alerts)
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text()
    for alert, row in zip(alerts, table, strict=True):
        assert row.startswith(f"| [`{alert}`](RUNBOOK.md#alert-{alert.lower()}) |"), row
        assert f'<a id="alert-{alert.lower()}"></a>' in runbook or f"### {alert} " in runbook


def test_every_event_type_of_the_catalogue_has_a_row_with_its_versions_and_meaning() -> None:
    table = {row.split(" | ")[0].removeprefix("| "): row for row in rows("events-table")}
    assert set(table) == {f"`{t}`" for t in CATALOG.types()}
    for event_type in CATALOG.types():
        versions = ", ".join(f"v{v}" for v in CATALOG.versions(event_type))
        row = table[f"`{event_type}`"]
        assert f" | {versions} | " in row
        assert row.split(" | ")[2].strip(), f"{event_type}: give its model a docstring"


def test_every_command_the_parser_runs_has_a_row() -> None:
    commands = [row.split("`")[1] for row in rows("cli-table")]
    for expected in ("ckpt-ha job stop", "ckpt-ha dead-letter replay", "ckpt-ha job run --job JOB"):
        assert any(c.startswith(expected) for c in commands), expected
    groups = ("ckpt-ha job {", "ckpt-ha checkpoint {")
    assert not [c for c in commands if c.startswith(groups)], "a group is not a command"
    assert not [c for c in commands if "[-h]" in c]


def test_metric_rows_name_counters_as_exposed_and_keep_their_labels() -> None:
    registry = CollectorRegistry()
    Counter("ckpt_ha_things", "Things done.", ["service", "kind"], registry=registry)
    Histogram("ckpt_ha_thing_seconds", "How long.", ["service"], registry=registry)
    Counter("other_things", "Not ours.", registry=registry)
    found = doc_tables.metric_rows([("a", registry), ("b", registry)])
    assert [(r.name, r.kind, r.labels, r.services) for r in found] == [
        ("ckpt_ha_thing_seconds", "histogram", ("service",), ["a", "b"]),
        ("ckpt_ha_things_total", "counter", ("service", "kind"), ["a", "b"]),
    ]


def test_the_metrics_table_holds_every_service_metric_once() -> None:
    names = [row.split("`")[1] for row in rows("metrics-table")]
    assert len(names) == len(set(names))
    for expected in ("ckpt_ha_service_up", "ckpt_ha_jobs_lost_total", "ckpt_ha_job_restarts_total"):
        assert expected in names


def test_every_requirement_cited_is_defined() -> None:
    defined = set(
        re.findall(r"^## (R\d+)\b", (ROOT / "docs" / "REQUIREMENTS.md").read_text(), re.M)
    )
    assert defined == {f"R{n}" for n in range(1, 22)}
    cited: dict[str, set[str]] = {}
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for folder in ("services", "contracts"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".json", ".lua")]
    for path in paths:
        for rid in re.findall(r"\bR(\d+)\b", path.read_text()):
            cited.setdefault(f"R{rid}", set()).add(str(path.relative_to(ROOT)))
    assert {"R1", "R10", "R17"} <= set(cited), "the search finds the citations"
    undefined = {rid: sorted(where) for rid, where in cited.items() if rid not in defined}
    assert not undefined, f"define in docs/REQUIREMENTS.md: {undefined}"
