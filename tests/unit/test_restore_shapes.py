"""A checkpoint written at one world size, restored at another (issue 28, deliverable 2): the
checkpoint's format decides what a world-size change means when no rule declares it."""

from __future__ import annotations

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointFormat,
    CheckpointIdentity,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import CompatibilityRule, JobPolicy
from ckpt_ha.contracts.resume import Compatibility, ResumeMode
from ckpt_ha.restore_coordinator.domain.compatibility import compatibility
from ckpt_ha.restore_coordinator.domain.shapes import across, world_change
from ckpt_ha.restore_coordinator.records import Target

ENV = RuntimeEnvironment(framework="torch", framework_version="2.5", python_version="3.11")
TWO, ONE = Topology(world_size=2), Topology(world_size=1)


def written_at(topology: Topology) -> CheckpointIdentity:
    return CheckpointIdentity(
        job_id="j", run_id="r", environment=ENV, topology=topology, code_version="abc"
    )


def at(topology: Topology) -> Target:
    return Target(ENV, topology, "abc")


def test_dcp_reshards_2_to_1_and_the_plan_says_so() -> None:
    verdict = compatibility(
        written_at(TWO), at(ONE), JobPolicy(), checkpoint_format=CheckpointFormat.TORCH_DCP
    )
    assert (verdict.compatibility, verdict.mode) == (
        Compatibility.DECLARED_COMPATIBLE, ResumeMode.COMPATIBLE,
    )  # fmt: skip
    assert any("reshard 2→1" in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize("fmt", [CheckpointFormat.NATIVE, CheckpointFormat.HF_TRAINER])
def test_a_whole_state_and_a_trainer_folder_load_at_any_world_size(fmt: CheckpointFormat) -> None:
    verdict = compatibility(written_at(TWO), at(ONE), JobPolicy(), checkpoint_format=fmt)
    assert verdict.mode is ResumeMode.COMPATIBLE
    if fmt is CheckpointFormat.HF_TRAINER:  # what holds for the optimizer state is said
        assert any("FSDP or DeepSpeed" in r for r in verdict.reasons)


@pytest.mark.parametrize("fmt", [CheckpointFormat.SAFETENSORS, CheckpointFormat.UNKNOWN, None])
def test_per_rank_parts_a_format_cannot_reshard_are_unknown_with_the_next_step(
    fmt: CheckpointFormat | None,
) -> None:
    verdict = compatibility(written_at(TWO), at(ONE), JobPolicy(), checkpoint_format=fmt)
    assert (verdict.compatibility, verdict.mode) == (Compatibility.UNKNOWN, None)
    assert any("next step: relaunch at world size 2" in r for r in verdict.reasons)


def test_a_declared_rule_still_wins_and_the_same_shape_is_exact() -> None:
    rule = CompatibilityRule(field="topology", written="2/1/1", target="1/1/1")
    verdict = compatibility(
        written_at(TWO), at(ONE), JobPolicy(compatible=(rule,)),
        checkpoint_format=CheckpointFormat.SAFETENSORS,
    )  # fmt: skip
    assert verdict.mode is ResumeMode.COMPATIBLE
    assert any("declared: topology" in r for r in verdict.reasons)
    same = compatibility(
        written_at(TWO), at(TWO), JobPolicy(), checkpoint_format=CheckpointFormat.TORCH_DCP
    )
    assert (same.compatibility, same.mode) == (Compatibility.IDENTICAL, ResumeMode.EXACT)


def test_a_change_of_model_parallelism_is_never_the_formats_to_decide() -> None:
    tp = Topology(world_size=2, tensor_parallel=2)
    assert world_change(tp, ONE) is None
    assert across(CheckpointFormat.TORCH_DCP, tp, ONE) is None
    verdict = compatibility(
        written_at(tp), at(ONE), JobPolicy(), checkpoint_format=CheckpointFormat.TORCH_DCP
    )
    assert verdict.compatibility is Compatibility.UNKNOWN
