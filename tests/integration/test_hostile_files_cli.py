"""Hostile commit evidence (`tests.support.hostile`) given to ``ckpt-ha verify`` as a process:
it prints one verdict, never a traceback (the readers and the watcher:
tests/unit/test_hostile_files.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hostile import build_case

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "case", ["manifest-huge-step", "commit-huge-step", "trainer-state-huge-step", "index-deep"]
)
def test_the_cli_prints_a_verdict_not_a_traceback(tmp_path: Path, case: str) -> None:
    folder = build_case(tmp_path, case)
    env = {**os.environ, "CKPT_HA_HOME": str(tmp_path / "home")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "services"), str(REPO / "contracts")])
    result = subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", "verify", str(folder)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    first = result.stdout.splitlines()[0]
    assert first.startswith(("CORRUPT  ", "INCOMPLETE  ")), first
    assert f"{folder}" in first
