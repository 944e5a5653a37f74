"""The plan is made for the attempt that loads it (issue 28, deliverable 2): a resumed attempt
whose ``job.started`` says it runs on another shape than the failed one gets the plan re-stated
for it (DCP: "reshard 2→1"), or an escalation when its format cannot load there; its continuity
verdict states the data position at the new world size. Pure domain first, then the handlers
on in-memory fakes (the same flow against real NATS and Redis is in
``tests/integration/test_restore_reshape.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.contracts import Envelope, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointState,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    Tolerance,
)
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.domain.selection import Candidate
from ckpt_ha.restore_coordinator.records import Point, Started, Target
from ckpt_ha.storage import FsStore
from tests.unit.test_restore_handlers import World

JOB = "job-u"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ENV = RuntimeEnvironment(framework="torch", framework_version="2.5", python_version="3.11")
TWO, ONE = Topology(world_size=2), Topology(world_size=1)
POLICY = JobPolicy(tolerances=(Tolerance(metric="loss", rel=1e-6),), continuity_steps=2)


def identity(topology: Topology = TWO) -> CheckpointIdentity:
    return CheckpointIdentity(
        job_id=JOB, run_id="run-1", attempt=1, environment=ENV, topology=topology,
        code_version="abc", created_at=T0,
    )  # fmt: skip


def candidate(fmt: CheckpointFormat = CheckpointFormat.TORCH_DCP) -> Candidate:
    return Candidate(
        checkpoint_id="c1", step=20, uri="file:///x/c1", state=CheckpointState.VALID,
        identity=identity(), exact_resume=True, format=fmt.value,
    )  # fmt: skip


def plan(**update: Any) -> ResumePlannedV2:
    base = ResumePlannedV2(
        job_id=JOB, plan_id="p1", failed_run_id="run-1", attempt=2, checkpoint_id="c1",
        checkpoint_uri="file:///x/c1", step=20, mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL, failed_at=T0, fallbacks=0, policy=POLICY,
    )  # fmt: skip
    return base.model_copy(update=update)


def loader(topology: Topology = ONE, *, plan_id: str = "p1", attempt: int = 2) -> Started:
    return Started(
        run_id="run-1", attempt=attempt, at=T0, policy=POLICY, environment=ENV,
        topology=topology, code_version="abc", plan_id=plan_id,
    )  # fmt: skip


ASSUMED = Target(ENV, TWO, "abc")


def test_a_dcp_plan_is_restated_for_a_loader_on_one_rank_as_a_reshard() -> None:
    found = domain.replan(plan(), candidate(), ASSUMED, loader(), data_position=640)
    assert found is not None
    assert found.planned is not None
    assert found.escalation is None
    restated = found.planned
    assert (restated.plan_id, restated.checkpoint_id, restated.attempt) == ("p1", "c1", 2)
    assert (restated.mode, restated.compatibility) == (
        ResumeMode.COMPATIBLE, Compatibility.DECLARED_COMPATIBLE,
    )  # fmt: skip
    said = " | ".join(restated.reasons)
    assert restated.reasons[0].startswith("re-planned for attempt 2, the attempt that loads it")
    assert "topology: 2/1/1 -> 1/1/1" in restated.reasons[0]
    assert "reshard 2→1" in said
    assert "data position at world size 1" in said
    assert "data position 640" in said
    # Stated once: weighed again for the same loader, nothing changes.
    assert domain.replan(restated, candidate(), ASSUMED, loader(), data_position=640) is None


def test_a_loader_on_the_failed_attempts_shape_keeps_the_plan() -> None:
    assert domain.replan(plan(), candidate(), ASSUMED, loader(TWO)) is None


def test_only_the_plans_own_loader_restates_it() -> None:
    assert domain.replan(plan(), candidate(), ASSUMED, loader(plan_id="other")) is None
    assert domain.replan(plan(), candidate(), ASSUMED, loader(attempt=3)) is None


def test_per_rank_parts_of_a_format_that_cannot_reshard_stop_with_the_next_step() -> None:
    found = domain.replan(plan(), candidate(CheckpointFormat.SAFETENSORS), ASSUMED, loader())
    assert found is not None
    assert found.planned is None
    assert found.escalation is not None
    assert found.escalation.reason is domain.Stop.COMPATIBILITY_UNKNOWN
    assert "relaunch at world size 2" in found.escalation.detail
    [event] = found.events
    assert (event.plan_id, event.attempt) == ("p1", 1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", [CheckpointFormat.NATIVE, CheckpointFormat.HF_TRAINER])
def test_whole_state_formats_are_restated_compatible(fmt: CheckpointFormat) -> None:
    found = domain.replan(plan(), candidate(fmt), ASSUMED, loader())
    assert found is not None
    assert found.planned is not None
    assert found.planned.mode is ResumeMode.COMPATIBLE


def point(step: int, loss: float, position: int | None = None) -> Point:
    return Point(step=step, at=T0, data_position=position or step, metrics={"loss": loss})


def test_continuity_at_a_new_world_size_states_the_samples_seen_and_the_sampler_order() -> None:
    trajectory = {s: point(s, 1.0 / s) for s in range(20, 26)}
    observed = [point(21, 1.0 / 21), point(22, 1.0 / 22)]
    result = domain.continuity(
        restored_step=20, trajectory=trajectory, observed=observed, policy=POLICY, world=(2, 1)
    )
    assert result.verdict == domain.VERIFIED
    names = [c.name for c in result.comparisons]
    assert "step 21: data_position (samples seen) at world size 1, the trajectory's at 2" in names
    assert result.comparisons[-1].name == "world size 2→1: the sampler's order carried over"
    assert result.comparisons[-1].observed == "yes"
    assert "carried over" in result.reason


def test_a_sampler_order_that_did_not_carry_over_diverges_and_says_so() -> None:
    trajectory = {s: point(s, 1.0 / s) for s in range(20, 26)}
    shuffled = [point(21, 1.0 / 21, position=99)]
    result = domain.continuity(
        restored_step=20, trajectory=trajectory, observed=shuffled, policy=POLICY, world=(2, 1)
    )
    assert result.verdict == domain.DIVERGED
    assert result.comparisons[-1].observed == "no"
    assert not result.comparisons[-1].ok
    assert "may not have carried over" in result.reason


def test_the_same_world_size_adds_nothing_to_continuity() -> None:
    trajectory = {s: point(s, 1.0 / s) for s in range(20, 26)}
    observed = [point(21, 1.0 / 21), point(22, 1.0 / 22)]
    result = domain.continuity(
        restored_step=20, trajectory=trajectory, observed=observed, policy=POLICY
    )
    assert result.verdict == domain.VERIFIED
    assert [c.name for c in result.comparisons][1] == "step 21: data_position"
    assert not any("world size" in c.name for c in result.comparisons)


# --- the handlers, on fakes ---


def record(fmt: CheckpointFormat, step: int = 20) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=f"{JOB}-c{step}", job_id=JOB, run_id="run-1", step=step,
        uri=f"file:///nowhere/{JOB}/step-{step}", format=fmt, state=CheckpointState.VALID,
        identity=identity(), exact_resume=True, created_at=T0 + timedelta(seconds=step),
        updated_at=T0 + timedelta(seconds=step),
    )  # fmt: skip


def ev(data: Any, key: str, seconds: float) -> Envelope[Any]:
    return build(data, source="test/runner", time=T0 + timedelta(seconds=seconds), key=key)


def started(attempt: int, topology: Topology, plan_id: str | None = None) -> Envelope[Any]:
    data = JobStartedV1(
        job_id=JOB, run_id="run-1", attempt=attempt, policy=POLICY, environment=ENV,
        topology=topology, code_version="abc", plan_id=plan_id,
    )  # fmt: skip
    return ev(data, f"started-{attempt}", 1000 * attempt)


def progress(step: int, attempt: int = 1, plan_id: str | None = None) -> Envelope[Any]:
    data = JobProgressV1(
        job_id=JOB, run_id="run-1", attempt=attempt, step=step, data_position=step * 32,
        metrics={"loss": 1.0 / step}, plan_id=plan_id,
    )  # fmt: skip
    return ev(data, f"p-{attempt}-{step}", 1000 * attempt + step / 10)


async def fail_at_two_ranks(world: World) -> ResumePlannedV2:
    h = world.handlers
    await h.on_started(started(1, TWO))
    for step in range(18, 26):
        await h.on_progress(progress(step))
    failure = JobFailedV1(
        job_id=JOB, run_id="run-1", attempt=1, cause=FailureCause.NODE_EXIT, signature="node_exit:9"
    )
    await h.on_failed(ev(failure, "failed-1", 1500))
    [planned] = world.data("resume.planned")
    assert (planned.mode, planned.compatibility) == ("exact_resume", "identical")
    return planned  # type: ignore[no-any-return]


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    root = tmp_path / "store"
    root.mkdir()
    return FsStore(root)


async def test_a_takeover_on_one_rank_restates_the_plan_and_verifies_at_world_size_1(
    store: FsStore,
) -> None:
    world = World(store, record(CheckpointFormat.TORCH_DCP))
    planned = await fail_at_two_ranks(world)
    resumed = started(2, ONE, planned.plan_id)
    await world.handlers.on_started(resumed)
    first, restated = world.data("resume.planned")
    assert first == planned
    assert restated.plan_id == planned.plan_id
    assert (restated.mode, restated.compatibility) == ("compatible_resume", "declared_compatible")
    assert any("reshard 2→1" in r for r in restated.reasons)
    assert any("data position 640" in r for r in restated.reasons)  # step 20 reported 20 * 32
    decision = await world.state.decision(JOB, 1)
    assert decision is not None
    assert decision.published
    assert '"compatible_resume"' in decision.events[0]  # the stored decision is the re-plan
    await world.handlers.on_started(resumed)  # a redelivery restates nothing again
    assert len(world.data("resume.planned")) == 2
    for step in (21, 22):
        await world.handlers.on_progress(progress(step, attempt=2, plan_id=planned.plan_id))
    [verified] = world.data("resume.verified")
    names = [c.name for c in verified.comparisons]
    assert "world size 2→1: the sampler's order carried over" in names
    assert any("samples seen) at world size 1" in n for n in names)


async def test_a_takeover_on_the_same_shape_publishes_nothing_more(store: FsStore) -> None:
    world = World(store, record(CheckpointFormat.TORCH_DCP))
    planned = await fail_at_two_ranks(world)
    await world.handlers.on_started(started(2, TWO, planned.plan_id))
    assert len(world.data("resume.planned")) == 1
    assert world.data("resume.escalated") == []


async def test_a_format_that_cannot_reshard_escalates_for_the_loader(store: FsStore) -> None:
    world = World(store, record(CheckpointFormat.SAFETENSORS))
    planned = await fail_at_two_ranks(world)
    await world.handlers.on_started(started(2, ONE, planned.plan_id))
    [stop] = world.data("resume.escalated")
    assert (stop.plan_id, stop.attempt) == (planned.plan_id, 1)
    assert stop.reason == "compatibility_unknown"
    assert "relaunch at world size 2" in stop.detail
