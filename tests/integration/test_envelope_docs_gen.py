"""The committed AsyncAPI documents are what `faststream docs gen` gives (run as a process; the
rest of the wire: tests/contract/test_envelope.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

"""Types with more than one version; every other type has only v1."""


@pytest.mark.parametrize("service", ["registrar", "writer-watcher"])
def test_faststream_docs_gen_gives_the_committed_document(service: str, tmp_path: Path) -> None:
    module = service.replace("-", "_")
    out = tmp_path / "asyncapi.json"
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("faststream")),
            "docs", "gen", "--factory", f"ckpt_ha.{module}.app:asyncapi_app", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    committed = files("ckpt_ha.contracts") / "asyncapi" / f"{service}.json"
    assert json.loads(out.read_text()) == json.loads(committed.read_text())
