"""The restore-coordinator's memory is a projection of the stream: the live handlers write it
through `RestoreProjection`, and replaying the stream they saw and published (as bytes, decoded
again) through the same projection into empty stores gives the same state, field for field.
Events of an older coordinator (without the fields a plan now carries) still project."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ckpt_ha.contracts import CATALOG, Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointRegisteredV1,
    CheckpointState,
    FailureSide,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobFailedV2,
    JobHeartbeatV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    JobStartedV2,
    JobSucceededV1,
    Tolerance,
)
from ckpt_ha.contracts.resume import (
    Compatibility,
    LoadBlame,
    ResumeEscalatedV2,
    ResumeLoadFailedV2,
    ResumeMode,
    ResumePlannedV2,
)
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.app import compose_handlers
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.records import Failure, PlanRecord, Started
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.pins import InMemoryPins
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.restores import InMemoryRestores

JOB = "job-p"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ENV = RuntimeEnvironment(framework="torch", framework_version="2.3.0", python_version="3.11.9")
TOPO = Topology(world_size=2)
POLICY = JobPolicy(
    tier="standard",
    tolerances=(Tolerance(metric="loss", abs=0.01),),
    continuity_steps=2,
    max_storage_errors=9,
)


def record(ckpt: str, step: int, attempt: int = 1) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=ckpt, job_id=JOB, run_id="run-1", step=step,
        uri=f"file:///nowhere/{JOB}/step-{step}", format=CheckpointFormat.NATIVE,
        state=CheckpointState.VALID,
        identity=CheckpointIdentity(
            job_id=JOB, run_id="run-1", attempt=attempt, environment=ENV, topology=TOPO,
            code_version="abc", created_at=T0,
        ),
        exact_resume=True, created_at=T0 + timedelta(seconds=step),
        updated_at=T0 + timedelta(seconds=step),
    )  # fmt: skip


RECORDS = [record(f"c{i}", step) for i, step in enumerate((100, 200, 300), start=1)]


class Stream:
    """What the stream holds: each event handled, then what its handler published."""

    def __init__(self, tmp: Path) -> None:
        self.pins = InMemoryPins()
        self.state = InMemoryRestores(self.pins)
        self.bus = RecordingPublisher()
        registry = InMemoryRegistry()
        registry.put(*RECORDS)
        (tmp / "store").mkdir()
        self.metrics = RestoreMetrics(ServiceMetrics("rc"))
        self.handlers = compose_handlers(
            self.state, self.pins, registry, FsStore(tmp / "store"), self.bus,
            lambda: T0 + timedelta(hours=1), self.metrics,
            load_failed_grace_s=0.2,
        )  # fmt: skip
        self.events: list[Envelope[EventData]] = []
        self.n = 0

    async def handle(self, data: EventData, handler: str) -> None:
        self.n += 1
        event = build(data, source="test", time=T0 + timedelta(seconds=self.n), key=f"{self.n}")
        seen = len(self.bus.events)
        await getattr(self.handlers, handler)(event)
        self.events += [event, *self.bus.events[seen:]]

    def published(self, event_type: str) -> list[Any]:
        return [e.data for e in self.bus.of_type(event_type)]


def started(attempt: int, plan_id: str | None = None) -> JobStartedV1:
    return JobStartedV1(
        job_id=JOB, run_id="run-1", attempt=attempt, policy=POLICY, environment=ENV,
        topology=TOPO, code_version="abc", plan_id=plan_id,
    )  # fmt: skip


def progress(step: int, attempt: int = 1, plan_id: str | None = None) -> JobProgressV1:
    return JobProgressV1(
        job_id=JOB, run_id="run-1", attempt=attempt, step=step, data_position=step * 64,
        rng_fingerprint=f"rng-{step}", metrics={"loss": 10.0 / step}, plan_id=plan_id,
    )  # fmt: skip


def failed(attempt: int, plan_id: str | None = None) -> JobFailedV1:
    return JobFailedV1(
        job_id=JOB, run_id="run-1", attempt=attempt, cause=FailureCause.NODE_EXIT,
        signature=f"sig-{attempt}", side=FailureSide.INFRASTRUCTURE, plan_id=plan_id,
    )  # fmt: skip


def memory(state: InMemoryRestores, pins: InMemoryPins) -> dict[str, Any]:
    return {
        "starts": state.starts,
        "lasts": state.lasts,
        "decisions": state.decisions,
        "plans": state.plans,
        "observed": state.observed,
        "verdicts": state.verdicts,
        "ended": state.ended,
        "watches": state.watches,
        "jobs": {job: asdict(j) for job, j in state.jobs.items()},
        "pins": pins.by_job,
    }


async def test_replaying_the_stream_gives_what_the_live_handlers_wrote(tmp_path: Path) -> None:
    live = Stream(tmp_path)
    await live.handle(started(1), "on_started")
    for step in (*range(195, 206), *range(295, 306)):
        await live.handle(progress(step), "on_progress")
    await live.handle(failed(1), "on_failed")
    [first] = live.published("resume.planned")
    await live.handle(started(2, first.plan_id), "on_started")
    await live.handle(
        ResumeLoadFailedV2(
            job_id=JOB, plan_id=first.plan_id, run_id="run-1", checkpoint_id="c3",
            reason="checksum", blame=LoadBlame.CHECKPOINT, side=FailureSide.INFRASTRUCTURE,
        ),
        "on_load_failed",
    )  # fmt: skip
    await live.handle(failed(2, first.plan_id), "on_failed")
    [_, fallback] = live.published("resume.planned")
    assert (fallback.checkpoint_id, fallback.fallbacks, fallback.failed_at) == (
        "c2",
        1,
        T0 + timedelta(seconds=24),
    )
    await live.handle(started(3, fallback.plan_id), "on_started")
    for step in (201, 202):
        await live.handle(progress(step, 3, fallback.plan_id), "on_progress")
    assert len(live.published("resume.verified")) == 1
    newer = CheckpointRegisteredV1(
        job_id=JOB, checkpoint_id="c4", uri="file:///nowhere/c4", step=400,
        state=CheckpointState.VALID,
        identity=CheckpointIdentity(job_id=JOB, run_id="run-1", attempt=3),
    )  # fmt: skip
    assert sorted(live.pins.by_job[JOB]) == ["c1", "c2", "c3"]
    await live.handle(newer, "on_registered")
    await live.handle(JobSucceededV1(job_id=JOB, run_id="run-1", attempt=3), "on_succeeded")
    before = memory(live.state, live.pins)
    assert before["verdicts"] == {fallback.plan_id: "verified"}
    assert before["ended"] == {JOB: 3}
    assert (len(before["decisions"]), len(before["plans"]), before["pins"]) == (2, 2, {})
    assert sorted(before["jobs"][JOB]["excluded"]) == [domain.exclusion("c3", first.checkpoint_uri)]

    pins, state = InMemoryPins(), InMemoryRestores()
    state.pin_store = pins
    registry = InMemoryRegistry()
    registry.put(*RECORDS)
    replay = RestoreProjection(state, pins, registry)
    for event in live.events:
        await replay.apply(CATALOG.decode(event.to_bytes()))  # as the stream holds it
    after = memory(state, pins)
    for what in before:
        assert after[what] == before[what], what


async def test_replaying_the_stream_restores_a_running_attempts_deadline(tmp_path: Path) -> None:
    """Heartbeat deadlines survive a rebuild: the replayed watch is the live one, due at the
    same time (the last sign of life plus the deadline, on the events' clock)."""
    live = Stream(tmp_path)
    start = JobStartedV2(**started(1).model_dump(), heartbeat_s=1.0, deadline_s=6.0)
    await live.handle(start, "on_started")  # at T0 + 1 s
    await live.handle(progress(10), "on_progress")
    for n in range(1, 4):
        beat = JobHeartbeatV1(job_id=JOB, run_id="run-1", attempt=1, sequence=n, last_step=10)
        await live.handle(beat, "on_heartbeat")  # the last at T0 + 5 s
    other = start.model_copy(update={"job_id": "job-q", "heartbeat_s": None, "deadline_s": None})
    await live.handle(other, "on_started")
    watch = await live.state.watch(JOB)
    assert watch is not None
    assert (watch.due, watch.last_step) == (T0 + timedelta(seconds=11), 10)
    assert await live.state.overdue(T0 + timedelta(seconds=12), 10) == [watch]

    state = InMemoryRestores()
    replay = RestoreProjection(state, state.pin_store, InMemoryRegistry())
    for event in live.events:
        await replay.apply(CATALOG.decode(event.to_bytes()))
    assert state.watches == live.state.watches
    assert await state.overdue(T0 + timedelta(seconds=10), 10) == []
    assert await state.overdue(T0 + timedelta(seconds=12), 10) == [watch]


async def test_a_pinned_plan_of_an_older_coordinator_is_recovered_from_the_state() -> None:
    """Before plans carried their failure time, fallback count and policy: the failed attempt's
    start and failure give them, and a fallback plan continues the chain it falls back in."""
    pins, state = InMemoryPins(), InMemoryRestores()
    state.pin_store = pins
    projection = RestoreProjection(state, pins, InMemoryRegistry())
    failed_at = T0 + timedelta(minutes=5)
    await state.record_started(JOB, Started.of(started(1), T0))
    await state.failure_context(JOB, 1, Failure(1, failed_at, "sig"), None, 1)

    def old_plan(attempt: int, ckpt: str, step: int, **extra: Any) -> Envelope[Any]:
        data = ResumePlannedV2(
            job_id=JOB, plan_id=domain.plan_id(JOB, "run-1", attempt - 1),
            failed_run_id="run-1", attempt=attempt, checkpoint_id=ckpt,
            checkpoint_uri=f"file:///nowhere/{ckpt}", step=step, mode=ResumeMode.EXACT,
            compatibility=Compatibility.IDENTICAL, pinned=(ckpt,), **extra,
        )  # fmt: skip
        return build(data, source="old", time=failed_at + timedelta(seconds=attempt), key="p")

    first = old_plan(2, "c3", 300)
    assert await projection.decided([first], published=True) is not None
    plan = await state.plan(first.data.plan_id)
    assert plan == PlanRecord.of(first.data, failed_at=failed_at, fallbacks=0, policy=POLICY)
    assert [(p.checkpoint_id, p.reason, p.attempt) for p in await pins.pins(JOB)] == [
        ("c3", "restored from", 2)
    ]
    second = old_plan(3, "c2", 200, fallback_from="c3")
    await projection.decided([second], published=True)
    chained = await state.plan(second.data.plan_id)
    assert chained is not None
    assert (chained.failed_at, chained.fallbacks, chained.failed_attempt) == (failed_at, 1, 2)
    assert (await state.decision(JOB, 2)) is not None


async def test_an_escalation_that_names_no_attempt_is_no_decision() -> None:
    """Leftovers a verified resume could not reclaim escalate, but decide no failure."""
    state = InMemoryRestores()
    projection = RestoreProjection(state, state.pin_store, InMemoryRegistry())
    data = ResumeEscalatedV2(job_id=JOB, plan_id="p1", reason="unreclaimable_leftovers",
                             next_step="docs/RUNBOOK.md#reclaim-leftovers")  # fmt: skip
    assert await projection.decided([build(data, source="t", time=T0, key="k")],
                                    published=True) is None  # fmt: skip
    assert state.decisions == {}
    assert state.ended == {}
    named = data.model_copy(update={"attempt": 4, "reason": "restart_loop"})
    assert await projection.decided([build(named, source="t", time=T0, key="k2")],
                                    published=True) is not None  # fmt: skip
    assert list(state.decisions) == [(JOB, 4)]
    assert state.ended == {JOB: 4}


async def test_a_replayed_cancellation_ends_the_run_and_records_no_failure() -> None:
    pins, state = InMemoryPins(), InMemoryRestores()
    state.pin_store = pins
    projection = RestoreProjection(state, pins, InMemoryRegistry())
    data = JobFailedV2(
        job_id=JOB, run_id="run-1", attempt=2, cause=FailureCause.CANCELLED, reported_by="slurm"
    )
    await projection.apply(CATALOG.decode(build(data, source="s", time=T0, key="c").to_bytes()))
    assert state.ended == {JOB: 2}
    assert await state.failures(JOB) == []


async def test_a_report_sent_before_the_failure_counts_when_read_after_the_plan(
    tmp_path: Path,
) -> None:
    """A coordinator catching up (restarted, or its report consumer behind) may read an
    attempt's last report after that attempt's failure was planned. Sent before the failure,
    it is the attempt's own progress, not a zombie's: it counts as if read in time order (as a
    rebuild reads it), so the live state and a rebuild's agree."""
    (tmp_path / "late").mkdir()
    late = Stream(tmp_path / "late")
    await late.handle(started(1), "on_started")
    for step in range(295, 305):
        await late.handle(progress(step), "on_progress")
    sent_before = build(
        progress(305), source="test", time=T0 + timedelta(seconds=late.n + 1), key="late"
    )
    late.n += 1  # the report's own time comes before the failure's
    await late.handle(failed(1), "on_failed")
    assert late.published("resume.planned")
    await late.handlers.on_progress(sent_before)
    stale = late.metrics.stale_progress.labels("rc")._value.get()
    assert stale == 0
    assert late.state.lasts[(JOB, 1)].step == 305

    (tmp_path / "in-order").mkdir()
    in_order = Stream(tmp_path / "in-order")
    await in_order.handle(started(1), "on_started")
    for step in range(295, 306):
        await in_order.handle(progress(step), "on_progress")
    await in_order.handle(failed(1), "on_failed")
    assert late.state.lasts[(JOB, 1)].step == in_order.state.lasts[(JOB, 1)].step
    assert late.state.jobs[JOB].trajectory == in_order.state.jobs[JOB].trajectory

    # Sent after the failure (a zombie's) it is fenced, whenever it is read.
    zombie = build(progress(306), source="test", time=T0 + timedelta(hours=1), key="zombie")
    await late.handlers.on_progress(zombie)
    assert late.metrics.stale_progress.labels("rc")._value.get() == 1
    assert late.state.lasts[(JOB, 1)].step == 305


async def test_progress_of_a_stale_attempt_is_ignored(tmp_path: Path) -> None:
    """Fencing (R17): once attempt 2 is planned, attempt 1's reports (a zombie behind a
    partition) neither join the trajectory nor feed attempt 2's continuity verdict; they are
    counted. A replay of the stream ignores them the same way."""
    live = Stream(tmp_path)
    await live.handle(started(1), "on_started")
    for step in range(295, 306):
        await live.handle(progress(step), "on_progress")
    await live.handle(failed(1), "on_failed")
    [plan] = live.published("resume.planned")
    await live.handle(started(2, plan.plan_id), "on_started")
    last_before = live.state.lasts[(JOB, 1)]
    trajectory_before = dict(live.state.jobs[JOB].trajectory)
    for step in (301, 302, 306):  # the zombie: the same steps with other metrics, and a new one
        zombie = progress(step).model_copy(update={"metrics": {"loss": 99.0}})
        await live.handle(zombie, "on_progress")
    assert live.state.lasts[(JOB, 1)] == last_before
    assert live.state.jobs[JOB].trajectory == trajectory_before
    stale = live.metrics.stale_progress.labels("rc")._value.get()
    assert stale == 3
    for step in (301, 302):
        await live.handle(progress(step, 2, plan.plan_id), "on_progress")
    assert len(live.published("resume.verified")) == 1
    assert live.published("resume.diverged") == []
    before = memory(live.state, live.pins)

    pins, state = InMemoryPins(), InMemoryRestores()
    state.pin_store = pins
    registry = InMemoryRegistry()
    registry.put(*RECORDS)
    replay = RestoreProjection(state, pins, registry)
    for event in live.events:
        await replay.apply(CATALOG.decode(event.to_bytes()))
    after = memory(state, pins)
    for what in before:
        assert after[what] == before[what], what
