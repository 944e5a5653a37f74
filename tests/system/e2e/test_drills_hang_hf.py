"""The drills of a rank that hangs (torchrun, 2 ranks) and of a Transformers Trainer (killed
mid-save; its own rotation), see `test_drills.py`. One stack serves every drill of this module
(started by the first drill, stopped at the end), beside those of `test_drills.py` and
`test_drills_torch.py`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.system.e2e.drill_runs import assert_restored, cli, drill, drill_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from drill_home(tmp_path_factory)


def test_a_rank_that_hangs_is_detected_stopped_and_resumed_exactly(home: Path) -> None:
    """Issue 28: a rank of a 2-rank torchrun job sleeps inside training, every process alive.
    No configuration: the runner's threshold comes from the job's own steps; it stops the
    group, reports the hang (rank, last step), and the relaunch continues bit for bit."""
    result = drill(home, "hang")
    assert_restored(result)
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert all(result["checks"].values()), result["checks"]
    hang = result["hang"]
    assert hang["stalled_ranks"] == [1]
    assert hang["last_step"] == 29
    assert hang["threshold_s"] == 30.0
    assert hang["survivors"] == []
    comparisons = result["levels"]["continued"]["evidence"]["comparisons"]
    assert [c for c in comparisons if c["name"].endswith(": loss")]
    assert all(c["ok"] for c in comparisons)


def test_a_trainer_killed_mid_save_resumes_from_the_newest_complete_checkpoint(
    home: Path,
) -> None:
    result = drill(home, "hf-trainer")
    assert_restored(result)
    assert result["partial_checkpoint"]["committed_or_registered"] == []
    assert result["partial_checkpoint"]["ended_failed"], result["partial_checkpoint"]
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert result["curves"]["baseline"]
    assert result["curves"]["drill"]
    assert "transformers" in result["baseline"]["environment"]


def test_a_trainers_own_rotation_is_recorded_as_its_writers_deletion_never_damage(
    home: Path,
) -> None:
    """A real Trainer with ``save_total_limit=2`` under `ckpt-ha run` (issue 28): the folders it
    rotates away are deleted by the job (a tombstone, the job as actor), never corrupt or
    quarantined; the newest two stay valid."""
    assert cli(home, "stack", "up").returncode == 0
    job = f"hf-rotate-{os.getpid()}"
    done = cli(
        home, "run", "--job", job, "--", sys.executable, "-m", "ckpt_ha.lab.examples.hf_gpt2",
        "--steps", "30", "--save-steps", "10", "--save-total-limit", "2", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    def records() -> dict[int, dict[str, Any]]:
        listed = cli(home, "checkpoint", "list", "--job", job, "--json")
        assert listed.returncode == 0, listed.stderr
        return {r["step"]: r for r in json.loads(listed.stdout)}

    deadline = time.monotonic() + 90  # the watcher decides 15 s after a folder went
    found = records()
    while time.monotonic() < deadline and found.get(10, {}).get("state") != "deleted":
        time.sleep(2)
        found = records()
    states = {step: r["state"] for step, r in found.items()}
    assert states == {10: "deleted", 20: "valid", 30: "valid"}, states
    for step in (10,):
        tombstone = found[step]["tombstone"]
        assert (tombstone["actor"], tombstone["policy"]) == (f"job:{job}", "writer-rotation")
        assert "deleted by its writer" in tombstone["reason"]
        assert all(h["state"] not in ("corrupt", "quarantined") for h in found[step]["history"])
