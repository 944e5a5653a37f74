"""The restore-coordinator's answers to an operator's acts (``ckpt-ha job hold|unhold|restore``)
against in-memory fakes: a held job's failure is recorded, not planned, and planned on unhold;
a chosen rollback is planned from the chosen checkpoint without quarantining the newer ones; a
rollback to another job's or a non-valid checkpoint is refused."""

from __future__ import annotations

from typing import Any

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.job import JobHeldV1, JobRestoreRequestedV1, JobUnheldV1
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from tests.unit import test_restore_handlers as base

JOB, World, ev, started, failed, progress = (
    base.JOB, base.World, base.ev, base.started, base.failed, base.progress,
)  # fmt: skip
store, world = base.store, base.world  # fixtures


def held() -> Any:
    return ev(JobHeldV1(job_id=JOB, actor="alice", reason="storage maintenance"), "h", 1200)


def unheld() -> Any:
    return ev(JobUnheldV1(job_id=JOB, actor="alice"), "u", 1800)


def rollback(ckpt: str, job: str = JOB) -> Any:
    data = JobRestoreRequestedV1(job_id=job, actor="bob", reason="loss spike", checkpoint_id=ckpt)
    return ev(data, f"r-{ckpt}", 1900)


async def test_a_held_jobs_failure_is_recorded_not_planned_then_planned_on_unhold(
    world: base.World,
) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_progress(progress(350))
    await h.on_held(held())
    await h.on_failed(failed())
    assert world.bus.events == []
    assert [f.attempt for f in await world.state.failures(JOB)] == [1]
    assert await world.state.decision(JOB, 1) is None
    await h.on_unheld(unheld())
    [plan] = world.data("resume.planned")
    assert (plan.checkpoint_id, plan.attempt) == (f"{JOB}-c3", 2)
    await h.on_unheld(unheld())  # a redelivery decides nothing again
    assert len(world.data("resume.planned")) == 1


async def test_unhold_without_a_failure_plans_nothing(world: base.World) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_held(held())
    await h.on_unheld(unheld())
    assert world.bus.events == []
    assert not await world.state.held(JOB)


async def test_a_chosen_rollback_plans_that_checkpoint_and_keeps_the_newer_ones(
    world: base.World,
) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_progress(progress(350))
    await h.on_held(held())
    await h.on_failed(failed())
    await h.on_restore_requested(rollback(f"{JOB}-c1"))
    [plan] = world.data("resume.planned")
    assert (plan.checkpoint_id, plan.step, plan.mode) == (f"{JOB}-c1", 100, "exact_resume")
    assert world.data("checkpoint.quarantined") == []
    for ckpt in (f"{JOB}-c2", f"{JOB}-c3"):
        rec = await world.registry.get(ckpt)
        assert rec is not None
        assert rec.state is CheckpointState.VALID
    assert await world.state.excluded(JOB) == set()  # left out of this decision only


async def test_a_rollback_to_another_jobs_or_a_non_valid_checkpoint_is_refused(
    store: Any,
) -> None:
    other = base.record("other-c1", 50).model_copy(update={"job_id": "other"})
    bad = base.record(f"{JOB}-c9", 400, state=CheckpointState.CORRUPT)
    w = base.World(store, *base.three(), other, bad)
    await w.handlers.on_started(started())
    await w.handlers.on_held(held())
    await w.handlers.on_failed(failed())
    for ckpt in ("other-c1", f"{JOB}-c9", "nowhere"):
        await w.handlers.on_restore_requested(rollback(ckpt))
    assert w.bus.events == []


async def test_a_hold_is_rebuilt_from_the_stream(world: base.World) -> None:
    projection = RestoreProjection(world.state, world.pins, world.registry)
    await projection.apply(held())
    assert await world.state.held(JOB)
    await projection.apply(unheld())
    assert not await world.state.held(JOB)


async def test_a_rollback_of_a_running_attempt_plans_the_next_one_and_its_failure_is_decided(
    world: base.World,
) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_progress(progress(350))
    await h.on_restore_requested(rollback(f"{JOB}-c2"))
    [plan] = world.data("resume.planned")
    assert (plan.checkpoint_id, plan.attempt) == (f"{JOB}-c2", 2)
    await h.on_failed(failed())  # the runner ended the attempt for the plan
    assert len(world.data("resume.planned")) == 1


async def test_a_rollback_after_the_next_attempt_started_plans_that_one(
    world: base.World,
) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    await h.on_started(started(2, plan_id=first.plan_id))
    await h.on_restore_requested(rollback(f"{JOB}-c1"))
    second = world.data("resume.planned")[-1]
    assert (second.checkpoint_id, second.attempt) == (f"{JOB}-c1", 3)
