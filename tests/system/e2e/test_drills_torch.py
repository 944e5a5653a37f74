"""The drills of 2-rank PyTorch DCP jobs (see `test_drills.py`): torchrun losing a rank, a job
taken over on 1 rank. One stack serves every drill of this module (started by the first drill,
stopped at the end), beside those of `test_drills.py` and `test_drills_hang_hf.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.e2e.drill_runs import assert_restored, drill, drill_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from drill_home(tmp_path_factory)


def test_torchrun_dcp_loses_a_rank_mid_training_and_mid_save_and_resumes_exactly(
    home: Path,
) -> None:
    """R7/R10 on a real multi-rank job: torchrun with 2 gloo ranks, PyTorch DCP through
    ckpt_ha.sdk.dcp. The rank's own cause is reported, every rank loads the same checkpoint and
    the recomputed steps match the pre-failure run bit for bit."""
    result = drill(home, "torchrun-dcp")
    first, mid_save = result["phases"]
    for phase in (first, mid_save):
        assert_restored(phase)
        assert phase["restored_from"] == phase["last_valid_checkpoint"]
        comparisons = phase["levels"]["continued"]["evidence"]["comparisons"]
        losses = [c for c in comparisons if c["name"].endswith(": loss")]
        assert losses, comparisons
        assert all(c["ok"] and c["tolerance"] == 0 for c in losses)
    assert [f["cause"] for f in result["failures"]] == ["node_exit", "node_exit"]
    assert all("rank 1" in f["detail"] for f in result["failures"])
    assert result["partial_checkpoint"]["committed_or_registered"] == []
    assert result["partial_checkpoint"]["ended_failed"], result["partial_checkpoint"]
    # The report carries the loss curve of the drill against the uninterrupted baseline.
    assert result["curves"]["baseline"]
    assert result["curves"]["drill"]
    assert result["baseline"]["resources"]["processes"] == 2


def test_a_2_rank_dcp_job_taken_over_on_1_rank_is_replanned_as_a_reshard(home: Path) -> None:
    """Issue 28: the host of a 2-rank DCP job is lost and `ckpt-ha run --resume` takes the run
    over on 1 rank. The plan decided for the failed attempt (exact) is re-stated for the one that
    loads it (compatible, "reshard 2→1"); the global state is restored at the checkpoint's step
    and data position, and the resumed steps match the 2-rank run to float32 rounding."""
    result = drill(home, "reshard")
    assert_restored(result)
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert all(result["checks"].values()), result["checks"]
    reshard = result["reshard"]
    assert reshard["failure"] == "lost"
    assert (reshard["planned_for_the_failed_attempt"], reshard["restated_for_the_loader"]) == (
        "exact_resume", "compatible_resume",
    )  # fmt: skip
    assert (reshard["loaded_world_size"], reshard["written_world_size"]) == (1, 2)
    comparisons = result["levels"]["continued"]["evidence"]["comparisons"]
    losses = [c for c in comparisons if c["name"].endswith(": loss")]
    assert losses, comparisons
    assert all(c["ok"] for c in comparisons)
    assert result["baseline"]["resources"]["processes"] == 2
