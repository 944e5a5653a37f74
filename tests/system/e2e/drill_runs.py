"""What the drill files share (`test_drills*.py`): `ckpt-ha` on a drill home, a drill run with
its verdict checked, the five levels of a restore. Each file has a stack of its own
(`drill_home`), so that the files run side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

LEVELS = ("generated", "verified", "registered", "loadable", "continued")


def cli(home: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
    env["CKPT_HA_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def drill_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A drill file's ``CKPT_HA_HOME`` (its module-scoped ``home``): the stack under it is
    started by the file's first drill and stopped after its last."""
    path = tmp_path_factory.mktemp("drills") / "ckpt-ha-home"
    yield path
    cli(path, "down", timeout=120)


def drill(home: Path, scenario: str, *extra: str) -> dict[str, Any]:
    done = cli(home, "drill", "--scenario", scenario, "--json", "--budget", "300", *extra)
    assert done.stdout, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert f"[{scenario}" in done.stderr  # progress lines while it runs
    assert done.returncode == (0 if result["verdict"] == "pass" else 1)
    assert result["verdict"] == "pass", (result.get("reasons"), done.stderr[-2000:])
    return result


def assert_restored(phase: dict[str, Any]) -> None:
    for name in LEVELS:
        level = phase["levels"][name]
        assert level["passed"], (name, phase["reasons"])
        assert level["evidence"]["event_id"]  # each level has its own event
    ids = [phase["levels"][n]["evidence"]["event_id"] for n in LEVELS]
    assert len(set(ids)) == len(LEVELS)
    assert phase["restored_from"] is not None
    assert phase["continue_step"] is not None
    assert phase["recompute_steps"] is not None
