"""The restore-coordinator's handlers against in-memory fakes of their ports (no NATS, no Redis):
plan on failure, duplicates, fallback after a load failure, escalations, continuity verdicts,
pins released, closure. The same flows run against the real services in
``tests/integration/test_restore_coordinator.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointRegisteredV1,
    CheckpointState,
    CopyState,
    FailureSide,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    FailureCauseV1,
    FailureCauseV2,
    JobFailedV1,
    JobFailedV2,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    Tolerance,
)
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV2, ResumeVerifiedV1
from ckpt_ha.core.copies import CopyRecord
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.app import compose_handlers
from ckpt_ha.restore_coordinator.handlers.decide import DecisionInProgress
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.pins import InMemoryPins
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.restores import InMemoryRestores
from tests.support.fakes.stream import InMemoryStream
from tests.support.stored_events_contract import check_stored_events

JOB = "job-u"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ENV = RuntimeEnvironment(
    framework="torch", framework_version="2.3.0", python_version="3.11.9", image="trainer:1"
)
TOPO = Topology(world_size=2)


def record(
    ckpt: str,
    step: int,
    *,
    state: CheckpointState = CheckpointState.VALID,
    attempt: int = 1,
    env: RuntimeEnvironment = ENV,
    uri: str | None = None,
) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=ckpt,
        job_id=JOB,
        run_id="run-1",
        step=step,
        uri=uri or f"file:///nowhere/{JOB}/step-{step}",
        format=CheckpointFormat.NATIVE,
        state=state,
        identity=CheckpointIdentity(
            job_id=JOB, run_id="run-1", attempt=attempt, environment=env, topology=TOPO,
            code_version="abc", created_at=T0,
        ),
        exact_resume=True,
        created_at=T0 + timedelta(seconds=step),
        updated_at=T0 + timedelta(seconds=step),
    )  # fmt: skip


def ev(data: EventData, key: str, seconds: float) -> Envelope[Any]:
    return build(data, source="test/runner", time=T0 + timedelta(seconds=seconds), key=key)


def started(
    attempt: int = 1,
    *,
    policy: JobPolicy | None = None,
    env: RuntimeEnvironment = ENV,
    plan_id: str | None = None,
) -> Envelope[Any]:
    data = JobStartedV1(
        job_id=JOB, run_id="run-1", attempt=attempt, policy=policy or JobPolicy(),
        environment=env, topology=TOPO, code_version="abc", plan_id=plan_id,
    )  # fmt: skip
    return ev(data, f"started-{attempt}", 1000 * attempt)


def failed(
    attempt: int = 1, *, key: str = "f", plan_id: str | None = None, sig: str = ""
) -> Envelope[Any]:
    data = JobFailedV1(
        job_id=JOB, run_id="run-1", attempt=attempt, cause=FailureCauseV1.NODE_EXIT, signal=9,
        signature=sig or f"node_exit:{attempt}", plan_id=plan_id,
    )  # fmt: skip
    return ev(data, f"{key}-{attempt}", 1000 * attempt + 500)


def progress(
    step: int, *, attempt: int = 1, plan_id: str | None = None, loss: float | None = None
) -> Envelope[Any]:
    data = JobProgressV1(
        job_id=JOB, run_id="run-1", attempt=attempt, step=step, data_position=step * 64,
        rng_fingerprint=f"rng-{step}", metrics={"loss": 10.0 / step if loss is None else loss},
        plan_id=plan_id,
    )  # fmt: skip
    return ev(data, f"p-{attempt}-{step}", 1000 * attempt + step / 10)


class World:
    """The handlers wired to fakes, plus what a test looks at."""

    def __init__(self, store: FsStore, *records: CheckpointRecord) -> None:
        self.registry = InMemoryRegistry()
        self.registry.put(*records)
        self.pins = InMemoryPins()
        self.state = InMemoryRestores(self.pins)
        self.bus = RecordingPublisher()
        self.stream = InMemoryStream()
        self.store = store
        self.service_metrics = ServiceMetrics("restore-coordinator")
        self.metrics = RestoreMetrics(self.service_metrics)
        ids = iter(range(1_000_000))
        self.clock: Callable[[], datetime] = lambda: T0 + timedelta(hours=1)
        self.handlers = compose_handlers(
            self.state,
            self.pins,
            self.registry,
            store,
            self.bus,
            lambda: self.clock(),
            self.metrics,
            new_id=lambda: f"owner-{next(ids)}",
            load_failed_grace_s=0.2,
            stored=self.stream,
        )

    def data(self, event_type: str) -> list[Any]:
        return [e.data for e in self.bus.of_type(event_type)]

    def decisions(self, outcome: str, detail: str) -> float | None:
        return self.service_metrics.registry.get_sample_value(
            "ckpt_ha_restore_decisions_total",
            {"service": "restore-coordinator", "outcome": outcome, "detail": detail},
        )


def three() -> list[CheckpointRecord]:
    return [record(f"{JOB}-c{i}", step) for i, step in enumerate((100, 200, 300), start=1)]


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    root = tmp_path / "store"
    root.mkdir()
    return FsStore(root)


@pytest.fixture
def world(store: FsStore) -> World:
    return World(store, *three())


async def test_a_failure_plans_the_newest_valid_checkpoint_and_pins_the_pair(world: World) -> None:
    h = world.handlers
    await h.on_started(started())
    for step in (300, 320, 350):
        await h.on_progress(progress(step))
    await h.on_failed(failed())
    [plan] = world.data("resume.planned")
    assert (plan.checkpoint_id, plan.attempt, plan.step, plan.expected_step) == (
        f"{JOB}-c3", 2, 300, 300,
    )  # fmt: skip
    assert (plan.mode, plan.compatibility) == ("exact_resume", "identical")
    assert plan.recompute_steps == 50
    assert plan.recompute_seconds == pytest.approx(5.0)  # progress at 300 → at 350
    assert plan.pinned == (f"{JOB}-c3", f"{JOB}-c2")
    assert plan.fallback_from is None
    pins = {p.checkpoint_id: p.reason for p in await world.pins.pins(JOB)}
    assert pins == {f"{JOB}-c3": "restored from", f"{JOB}-c2": "fallback"}
    stored = await world.state.plan(plan.plan_id)
    assert stored is not None
    assert (stored.checkpoint_id, stored.failed_attempt, stored.attempt) == (f"{JOB}-c3", 1, 2)
    decision = await world.state.decision(JOB, 1)
    assert decision is not None
    assert decision.published
    assert world.decisions("planned", "exact_resume") == 1.0
    assert world.state.leases == {}  # released


def cancelled(attempt: int = 1) -> Envelope[Any]:
    data = JobFailedV2(
        job_id=JOB, run_id="run-1", attempt=attempt, cause=FailureCauseV2.CANCELLED,
        exit_code=0, signal=15, side=FailureSide.JOB, signature="cancelled:x",
        reported_by="slurm",
    )  # fmt: skip
    return ev(data, f"cancelled-{attempt}", 1000 * attempt + 500)


async def test_a_cancelled_attempt_is_never_restored_and_ends_the_run(world: World) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_progress(progress(350))
    await h.on_failed(cancelled())
    assert world.bus.events == []  # no plan, no escalation (no page)
    assert await world.state.decision(JOB, 1) is None
    assert await world.state.failures(JOB) == []  # not a failure to count towards a loop
    assert world.state.ended == {JOB: 1}  # like job.succeeded: its records may expire
    await h.on_failed(cancelled())  # a redelivery changes nothing
    assert world.bus.events == []


async def test_a_cancelled_attempt_needs_no_start_to_end_the_run(world: World) -> None:
    await world.handlers.on_failed(cancelled(3))  # a start never seen: nothing to wait for
    assert world.bus.events == []
    assert world.state.ended == {JOB: 3}


async def test_a_duplicated_failure_republishes_the_same_plan(world: World) -> None:
    h = world.handlers
    await h.on_started(started())
    for copy in range(3):  # new event ids, same failure
        await h.on_failed(failed(key=f"copy{copy}"))
    assert len(world.data("resume.planned")) == 1
    assert world.decisions("planned", "exact_resume") == 1.0
    assert [f.attempt for f in await world.state.failures(JOB)] == [1]


async def test_a_decision_in_progress_elsewhere_is_retried(world: World) -> None:
    await world.handlers.on_started(started())
    assert await world.state.lease(JOB, 1, "other-replica", 30.0)
    with pytest.raises(DecisionInProgress):
        await world.handlers.on_failed(failed())
    assert world.bus.events == []


async def test_a_decision_in_progress_elsewhere_is_waited_for_a_while(world: World) -> None:
    """Another replica holds the failure's lease for a moment (its own delivery of the same
    failure): this delivery waits for the lease (`lease_waiting`) instead of spending a nak,
    then decides, as the holder let it go undecided; one plan."""
    await world.handlers.on_started(started())
    assert await world.state.lease(JOB, 1, "other-replica", 30.0)

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await world.state.release(JOB, 1)

    releasing = asyncio.create_task(release_soon())
    await world.handlers.on_failed(failed())
    await releasing
    assert len(world.data("resume.planned")) == 1
    assert world.decisions("planned", "exact_resume") == 1.0


async def test_a_failure_before_its_start_waits_for_it(world: World) -> None:
    from ckpt_ha.core.errors import DependencyNotReady

    with pytest.raises(DependencyNotReady):
        await world.handlers.on_failed(failed())
    await world.handlers.on_started(started())
    await world.handlers.on_failed(failed())
    assert len(world.data("resume.planned")) == 1


async def test_a_load_failure_quarantines_and_falls_back_once(world: World, store: FsStore) -> None:
    h = world.handlers
    store.put(f"{JOB}/step-300/shard-0.bin", b"bad")
    world.registry.put(record(f"{JOB}-c3", 300, uri=store.uri(f"{JOB}/step-300")))
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    await h.on_started(started(2, plan_id=first.plan_id))
    load_failed = ResumeLoadFailedV2(
        job_id=JOB, plan_id=first.plan_id, run_id="run-1", checkpoint_id=first.checkpoint_id,
        reason="checksum mismatch in shard 0", side=FailureSide.INFRASTRUCTURE,
        blame=LoadBlame.CHECKPOINT,
    )  # fmt: skip
    await h.on_load_failed(ev(load_failed, "lf", 2100))
    [q] = world.data("checkpoint.quarantined")
    assert (q.checkpoint_id, q.reason) == (f"{JOB}-c3", "load failed: checksum mismatch in shard 0")
    assert q.quarantine_uri is not None  # the bytes moved aside before the event
    assert not store.exists(f"{JOB}/step-300/shard-0.bin")
    plans = world.data("resume.planned")
    assert [(p.attempt, p.checkpoint_id, p.fallback_from) for p in plans] == [
        (2, f"{JOB}-c3", None),
        (3, f"{JOB}-c2", f"{JOB}-c3"),
    ]
    fallback = await world.state.plan(plans[1].plan_id)
    assert fallback is not None
    assert fallback.fallbacks == 1
    history = await world.state.history(JOB, 2, 8)
    assert len(history.storage_errors) == 1  # an infrastructure-side load failure counts
    # The resumed attempt's own job.failed (no progress) finds the fallback already decided.
    await h.on_failed(failed(2, plan_id=first.plan_id))
    assert len(world.data("resume.planned")) == 2
    assert world.data("resume.escalated") == []


async def test_a_resumed_attempt_failing_before_progress_waits_for_its_load_failure(
    world: World,
) -> None:
    """A resumed attempt that failed before any progress most likely failed to load: within the
    load-failure grace its failure is not ready yet (nak'ed, the bus redelivers it later, no
    clock read but the coordinator's), so the fallback its ``resume.load_failed`` plans is what
    gets planned, once. Past the grace, with no load failure heard, it is decided itself."""
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    await h.on_started(started(2, plan_id=first.plan_id))
    fail = failed(2, plan_id=first.plan_id)
    world.clock = lambda: fail.time + timedelta(seconds=0.1)  # within the 0.2 s grace
    with pytest.raises(DependencyNotReady, match="load failure") as waits:
        await h.on_failed(fail)
    assert not waits.value.in_stream  # its own deadline: the grace
    assert len(world.data("resume.planned")) == 1
    load_failed = ResumeLoadFailedV2(
        job_id=JOB, plan_id=first.plan_id, run_id="run-1", checkpoint_id=first.checkpoint_id,
        reason="checksum mismatch in shard 0", side=FailureSide.JOB, blame=LoadBlame.CHECKPOINT,
    )  # fmt: skip
    await h.on_load_failed(ev(load_failed, "lf", 2100))
    await h.on_failed(fail)  # redelivered: finds the fallback decided
    plans = world.data("resume.planned")
    assert [(p.attempt, p.fallback_from) for p in plans] == [(2, None), (3, first.checkpoint_id)]
    # Another resumed attempt failing before progress, with no load failure: decided itself
    # once past the grace.
    await h.on_started(started(3, plan_id=plans[1].plan_id))
    again = failed(3, plan_id=plans[1].plan_id)
    world.clock = lambda: again.time + timedelta(seconds=0.1)
    with pytest.raises(DependencyNotReady):
        await h.on_failed(again)
    world.clock = lambda: again.time + timedelta(seconds=1)
    await h.on_failed(again)
    assert [p.attempt for p in world.data("resume.planned")] == [2, 3, 4]


async def test_a_failure_past_the_grace_waits_for_a_load_failure_being_decided(
    world: World,
) -> None:
    """On a loaded coordinator the load failure's consumer may have excluded the plan's
    checkpoint, but not stored its decision yet, when the attempt's failure is handled past the
    grace: the failure waits for it (an earlier event's effect), so the fallback is planned."""
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    await h.on_started(started(2, plan_id=first.plan_id))
    fail = failed(2, plan_id=first.plan_id)
    world.clock = lambda: fail.time + timedelta(seconds=5)  # long past the 0.2 s grace
    await world.state.exclude(JOB, first.checkpoint_id)  # the other consumer, midway
    with pytest.raises(DependencyNotReady, match="load failure") as waits:
        await h.on_failed(fail)
    assert waits.value.in_stream
    load_failed = ResumeLoadFailedV2(
        job_id=JOB, plan_id=first.plan_id, run_id="run-1", checkpoint_id=first.checkpoint_id,
        reason="checksum mismatch in shard 0", side=FailureSide.JOB, blame=LoadBlame.CHECKPOINT,
    )  # fmt: skip
    await h.on_load_failed(ev(load_failed, "lf", 2100))
    await h.on_failed(fail)  # redelivered: finds the fallback decided
    plans = world.data("resume.planned")
    assert [(p.attempt, p.fallback_from) for p in plans] == [(2, None), (3, first.checkpoint_id)]


async def test_a_load_failure_blaming_the_attempt_never_quarantines(
    world: World, store: FsStore
) -> None:
    """R7: a loader that cannot read the format is evidence against the attempt: the valid
    checkpoint keeps its bytes and state, and a human is paged with the reason (no fallback
    chain that would quarantine every valid checkpoint in turn)."""
    h = world.handlers
    store.put(f"{JOB}/step-300/.metadata", b"dcp")
    world.registry.put(record(f"{JOB}-c3", 300, uri=store.uri(f"{JOB}/step-300")))
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    await h.on_started(started(2, plan_id=first.plan_id))
    lf = ResumeLoadFailedV2(
        job_id=JOB, plan_id=first.plan_id, run_id="run-1", checkpoint_id=first.checkpoint_id,
        reason="the planned checkpoint is format torch_dcp, which ckpt_ha.sdk.resume() does "
        "not read", side=FailureSide.JOB, blame=LoadBlame.ATTEMPT,
    )  # fmt: skip
    await h.on_load_failed(ev(lf, "lf", 2100))
    assert world.data("checkpoint.quarantined") == []
    assert store.exists(f"{JOB}/step-300/.metadata")
    assert await world.state.excluded(JOB) == set()
    [esc] = world.data("resume.escalated")
    assert esc.reason == "attempt_cannot_load"
    assert "stays valid" in esc.detail
    assert "torch_dcp" in esc.detail
    assert esc.next_step.startswith("docs/RUNBOOK.md#prepare-environment")
    assert len(world.data("resume.planned")) == 1


async def test_storage_failing_a_load_plans_the_same_checkpoint_again(world: World) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    await h.on_started(started(2, plan_id=first.plan_id))
    lf = ResumeLoadFailedV2(
        job_id=JOB, plan_id=first.plan_id, run_id="run-1", checkpoint_id=first.checkpoint_id,
        reason="storage unavailable", side=FailureSide.INFRASTRUCTURE, blame=LoadBlame.ATTEMPT,
    )  # fmt: skip
    await h.on_load_failed(ev(lf, "lf", 2100))
    assert world.data("checkpoint.quarantined") == []
    plans = world.data("resume.planned")
    assert [(p.attempt, p.checkpoint_id, p.fallback_from) for p in plans] == [
        (2, first.checkpoint_id, None),
        (3, first.checkpoint_id, None),
    ]
    history = await world.state.history(JOB, 2, 8)
    assert len(history.storage_errors) == 1


async def test_fallbacks_exhausted_escalate(world: World) -> None:
    h = world.handlers
    policy = JobPolicy(max_fallbacks=1)
    await h.on_started(started(policy=policy))
    await h.on_failed(failed())
    for n in range(2):
        [plan] = world.data("resume.planned")[-1:]
        await h.on_started(started(plan.attempt, policy=policy, plan_id=plan.plan_id))
        lf = ResumeLoadFailedV2(
            job_id=JOB, plan_id=plan.plan_id, run_id="run-1", checkpoint_id=plan.checkpoint_id,
            reason="bad", side=FailureSide.JOB, blame=LoadBlame.CHECKPOINT,
        )  # fmt: skip
        await h.on_load_failed(ev(lf, f"lf{n}", 2100 + n))
    [esc] = world.data("resume.escalated")
    assert esc.reason == "fallbacks_exhausted"
    assert esc.next_step.startswith("docs/RUNBOOK.md#choose-rollback-version")


async def test_a_restart_loop_escalates_and_stops_planning(world: World) -> None:
    h = world.handlers
    policy = JobPolicy(max_restarts=2, restart_window_s=3600)
    for attempt in (1, 2, 3):
        await h.on_started(started(attempt, policy=policy))
        await h.on_failed(failed(attempt))
    assert [p.attempt for p in world.data("resume.planned")] == [2, 3]
    [esc] = world.data("resume.escalated")
    assert esc.reason == "restart_loop"
    assert "2 automatic restores" in esc.detail
    assert world.decisions("escalated", "restart_loop") == 1.0


async def test_no_valid_checkpoint_escalates(store: FsStore) -> None:
    world = World(store, record(f"{JOB}-w", 100, state=CheckpointState.WRITING))
    await world.handlers.on_started(started())
    await world.handlers.on_failed(failed())
    [esc] = world.data("resume.escalated")
    assert esc.reason == "no_valid_checkpoint"
    assert world.data("resume.planned") == []
    assert await world.pins.pins(JOB) == []


async def test_an_unknown_environment_escalates_or_initialises_weights_by_policy(
    world: World,
) -> None:
    new_fw = ENV.model_copy(update={"framework_version": "2.4.0"})
    await world.handlers.on_started(started(env=new_fw))
    await world.handlers.on_failed(failed())
    [esc] = world.data("resume.escalated")
    assert esc.reason == "compatibility_unknown"
    assert "framework_version: 2.3.0 -> 2.4.0 (no declared rule)" in esc.detail
    await world.handlers.on_started(
        started(2, env=new_fw, policy=JobPolicy(allow_weights_only=True))
    )
    await world.handlers.on_failed(failed(2))
    [plan] = world.data("resume.planned")
    assert (plan.mode, plan.compatibility) == ("weights_only_init", "unknown")


def anonymous(ckpt: str, step: int, at_seconds: float) -> CheckpointRecord:
    """A checkpoint written by plain ``dcp.save``: no identity of its own."""
    base = record(ckpt, step).model_copy(
        update={"identity": None, "format": CheckpointFormat.TORCH_DCP, "run_id": "unknown"}
    )
    return base.model_copy(update={"created_at": T0 + timedelta(seconds=at_seconds)})


async def test_a_checkpoint_without_identity_inherits_its_writers_and_resumes(
    store: FsStore,
) -> None:
    """R14: a DCP checkpoint that appeared while attempt 1 ran is bound to what attempt 1
    declared; restoring it onto the same environment is an exact resume, not `unknown`."""
    world = World(store, anonymous(f"{JOB}-d1", 100, 1500))
    await world.handlers.on_started(started())
    await world.handlers.on_failed(failed())
    [plan] = world.data("resume.planned")
    assert (plan.checkpoint_id, plan.mode, plan.compatibility) == (
        f"{JOB}-d1",
        "exact_resume",
        "identical",
    )
    assert "taken from attempt 1's job.started" in plan.reasons[0]


async def test_an_inherited_identity_lists_exactly_what_changed(store: FsStore) -> None:
    """Attempt 1 wrote the checkpoint on torch 2.3.0; attempt 2 (a relaunch on a new image,
    no plan) runs 2.4.0 and fails: the escalation names that one field and nothing else."""
    world = World(store, anonymous(f"{JOB}-d1", 100, 1500))
    await world.handlers.on_started(started())
    new_fw = ENV.model_copy(update={"framework_version": "2.4.0"})
    await world.handlers.on_started(started(2, env=new_fw))
    await world.handlers.on_failed(failed(2))
    [esc] = world.data("resume.escalated")
    assert esc.reason == "compatibility_unknown"
    assert "framework_version: 2.3.0 -> 2.4.0 (no declared rule)" in esc.detail
    assert "<none>" not in esc.detail  # nothing reported missing that the attempt declared


async def test_a_checkpoint_older_than_every_known_start_stays_unknown(store: FsStore) -> None:
    world = World(store, anonymous(f"{JOB}-d0", 100, -50))
    await world.handlers.on_started(started())
    await world.handlers.on_failed(failed())
    [esc] = world.data("resume.escalated")
    assert esc.reason == "compatibility_unknown"
    assert "code_version: <none> -> abc" in esc.detail


@pytest.mark.parametrize(("off", "verdict"), [(0.0, "resume.verified"), (0.5, "resume.diverged")])
async def test_continuity_after_resume(world: World, off: float, verdict: str) -> None:
    h = world.handlers
    policy = JobPolicy(tolerances=(Tolerance(metric="loss", abs=0.01, rel=0.01),),
                       continuity_steps=2)  # fmt: skip
    await h.on_started(started(policy=policy))
    for step in range(295, 311):
        await h.on_progress(progress(step))
    await h.on_failed(failed())
    [plan] = world.data("resume.planned")
    await h.on_started(started(2, policy=policy, plan_id=plan.plan_id))
    for step in (301, 302):
        await h.on_progress(progress(step, attempt=2, plan_id=plan.plan_id, loss=10.0 / step + off))
    [found] = world.data(verdict)
    assert found.plan_id == plan.plan_id
    assert await world.state.verdict(plan.plan_id) == verdict.split(".")[1]
    if off:
        assert found.step == 301
        assert "step 301: loss" in found.reason
    else:
        assert found.step == 302
        assert all(c.ok for c in found.comparisons)
    # Once decided, the resumed attempt's reports become the job's trajectory.
    now_at = await world.state.point_at(JOB, 301)
    assert now_at is not None
    assert now_at.attempt == 2
    # After the verdict, progress is trajectory again and no second verdict comes.
    await h.on_progress(progress(303, attempt=2, plan_id=plan.plan_id))
    assert len(world.data(verdict)) == 1


async def test_a_newer_valid_checkpoint_of_the_resumed_attempt_unpins(world: World) -> None:
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    assert len(await world.pins.pins(JOB)) == 2

    def registered(ckpt: str, step: int, attempt: int, state: CheckpointState) -> Envelope[Any]:
        identity = CheckpointIdentity(job_id=JOB, run_id="run-1", attempt=attempt, created_at=T0)
        data = CheckpointRegisteredV1(
            job_id=JOB, checkpoint_id=ckpt, uri=f"file:///x/{ckpt}", step=step, state=state,
            identity=identity,
        )  # fmt: skip
        return ev(data, ckpt, 3000)

    await h.on_registered(registered("late", 310, 1, CheckpointState.VALID))  # the failed attempt
    await h.on_registered(registered("bad", 400, 2, CheckpointState.CORRUPT))  # not valid
    assert len(await world.pins.pins(JOB)) == 2
    await h.on_registered(registered("c4", 400, 2, CheckpointState.VALID))
    assert await world.pins.pins(JOB) == []


async def test_closure_deletes_the_failed_attempts_partial_write_and_escalates_the_rest(
    store: FsStore,
) -> None:
    store.put(f"{JOB}/step-400/shard-0.bin", b"partial")
    store.put(f"{JOB}/step-400/shard-1.bin", b"partial")
    partial = record(f"{JOB}-p", 400, state=CheckpointState.WRITING,
                     uri=store.uri(f"{JOB}/step-400"))  # fmt: skip
    elsewhere = record(f"{JOB}-e", 410, state=CheckpointState.WRITE_FAILED,
                       uri="s3://other-bucket/x")  # fmt: skip
    partial = partial.model_copy(update={"created_at": T0 + timedelta(seconds=1200)})
    elsewhere = elsewhere.model_copy(update={"created_at": T0 + timedelta(seconds=1200)})
    world = World(store, *three(), partial, elsewhere)
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [plan] = world.data("resume.planned")
    verified = ResumeVerifiedV1(
        job_id=JOB, plan_id=plan.plan_id, run_id="run-1", checkpoint_id=plan.checkpoint_id,
        step=301,
    )  # fmt: skip
    await h.on_verified(ev(verified, "v", 3000))
    [closed] = world.data("resume.closed")
    assert closed.cleaned == (partial.uri,)
    assert closed.unreclaimable == ("s3://other-bucket/x: outside this coordinator's storage root",)
    assert list(store.list(f"{JOB}/step-400/")) == []
    # R6: what it deleted gets a tombstone; what it could not touch does not.
    [tombstone] = world.data("checkpoint.deleted")
    assert (tombstone.checkpoint_id, tombstone.uri) == (partial.checkpoint_id, partial.uri)
    assert (tombstone.actor, tombstone.objects_deleted) == ("restore-coordinator", 2)
    assert f"resume plan {plan.plan_id}" in tombstone.reason
    [esc] = world.data("resume.escalated")
    assert esc.reason == "unreclaimable_leftovers"


async def test_unknown_plans_are_ignored(world: World) -> None:
    verified = ResumeVerifiedV1(
        job_id=JOB, plan_id="nope", run_id="run-1", checkpoint_id="c", step=1
    )
    await world.handlers.on_verified(ev(verified, "v", 1))
    lf = ResumeLoadFailedV2(
        job_id=JOB,
        plan_id="nope",
        run_id="run-1",
        checkpoint_id="unknown",
        reason="x",
        blame=LoadBlame.CHECKPOINT,
    )
    await world.handlers.on_load_failed(ev(lf, "lf", 1))
    assert world.bus.events == []
    assert await world.state.exclude(JOB, "other") == {"unknown", "other"}


async def test_a_fresh_failure_waits_for_a_newer_checkpoint_still_being_verified(
    store: FsStore,
) -> None:
    """A job that crashed right after a save: its newest checkpoint is committed but not yet
    verified. The failure is not decided on the older one (nor escalated when none is valid
    yet): it waits (nak'ed) until that checkpoint is verified, then plans it."""
    pending = record(f"{JOB}-200", 200, state=CheckpointState.PENDING_VERIFICATION)
    world = World(store, record(f"{JOB}-100", 100), pending)
    fail = failed()
    world.clock = lambda: fail.time + timedelta(seconds=2)
    await world.handlers.on_started(started())
    with pytest.raises(DependencyNotReady, match=f"verification of {JOB}-200"):
        await world.handlers.on_failed(fail)
    assert world.data("resume.planned") == []
    assert world.data("resume.escalated") == []
    world.registry.put(record(f"{JOB}-200", 200))  # the checker verified it
    await world.handlers.on_failed(fail)
    [plan] = world.data("resume.planned")
    assert (plan.checkpoint_id, plan.step) == (f"{JOB}-200", 200)


async def test_a_failure_past_the_verification_grace_is_decided_with_what_is_valid(
    store: FsStore,
) -> None:
    pending = record(f"{JOB}-200", 200, state=CheckpointState.PENDING_VERIFICATION)
    world = World(store, record(f"{JOB}-100", 100), pending)
    fail = failed()
    world.clock = lambda: fail.time + timedelta(seconds=41)
    await world.handlers.on_started(started())
    await world.handlers.on_failed(fail)
    [plan] = world.data("resume.planned")
    assert plan.checkpoint_id == f"{JOB}-100"


async def test_only_a_checkpoint_being_verified_waits_then_escalates_when_it_never_is(
    store: FsStore,
) -> None:
    world = World(store, record(f"{JOB}-200", 200, state=CheckpointState.PENDING_VERIFICATION))
    fail = failed()
    now = [fail.time + timedelta(seconds=1)]
    world.clock = lambda: now[0]
    await world.handlers.on_started(started())
    with pytest.raises(DependencyNotReady):
        await world.handlers.on_failed(fail)
    now[0] = fail.time + timedelta(seconds=40)
    await world.handlers.on_failed(fail)
    [esc] = world.data("resume.escalated")
    assert esc.reason == "no_valid_checkpoint"


def commit_at(step: int, seconds: float) -> Envelope[Any]:
    data = CheckpointCommittedV1(
        job_id=JOB, checkpoint_id=f"{JOB}-{step}", uri=f"file:///nowhere/{JOB}/step-{step}",
        run_id="run-1", step=step, format=CheckpointFormat.NATIVE, shard_count=1, total_bytes=1,
    )  # fmt: skip
    return ev(data, f"commit-{step}", seconds)


async def test_a_failure_a_moment_after_a_save_waits_for_its_commit_to_be_registered(
    store: FsStore,
) -> None:
    """The job crashed right after a save and its failure is heard before the registrar handled
    the commit: deciding now would restore the older checkpoint and leave the newer one to be
    fenced. The failure waits (nak'ed, within the verification grace) until the commit is
    registered, then for its verification, then plans it."""
    world = World(store, record(f"{JOB}-100", 100))
    fail = failed()
    world.stream.add(commit_at(200, 1499))
    world.clock = lambda: fail.time + timedelta(seconds=2)
    await world.handlers.on_started(started())
    with pytest.raises(DependencyNotReady, match=f"register its commit {JOB}-200") as waits:
        await world.handlers.on_failed(fail)
    assert not waits.value.in_stream  # the grace is its deadline, not a redelivery's
    assert world.data("resume.planned") == []
    world.registry.put(record(f"{JOB}-200", 200, state=CheckpointState.PENDING_VERIFICATION))
    with pytest.raises(DependencyNotReady, match=f"verification of {JOB}-200"):
        await world.handlers.on_failed(fail)
    world.registry.put(record(f"{JOB}-200", 200))
    await world.handlers.on_failed(fail)
    [plan] = world.data("resume.planned")
    assert plan.checkpoint_id == f"{JOB}-200"


@pytest.mark.parametrize(
    ("committed_s", "now_s"),
    [
        (+1, 2),  # committed after the failure: a stale writer's, never waited for
        (-1, 41),  # past the grace: decided with what is valid, the stream not even read
    ],
)
async def test_a_commit_is_not_waited_for_after_the_failure_or_past_the_grace(
    store: FsStore, committed_s: float, now_s: float
) -> None:
    world = World(store, record(f"{JOB}-100", 100))
    fail = failed()
    world.stream.add(commit_at(200, 1500 + committed_s))
    world.clock = lambda: fail.time + timedelta(seconds=now_s)
    await world.handlers.on_started(started())
    await world.handlers.on_failed(fail)
    [plan] = world.data("resume.planned")
    assert plan.checkpoint_id == f"{JOB}-100"
    assert world.stream.reads == (1 if now_s < 40 else 0)


async def test_the_in_memory_stream_answers_as_the_bus_does() -> None:
    stream = InMemoryStream()

    async def add(event: Envelope[EventData]) -> None:
        stream.add(event)

    await check_stored_events(stream, add)


def with_copy(store: FsStore, step: int) -> CheckpointRecord:
    """A valid checkpoint at a location of ``store`` with a verified copy on a replica."""
    base = record(f"{JOB}-c{step}", step, uri=store.uri(f"{JOB}/step-{step}"))
    copy = CopyRecord(uri=f"s3://copies/{JOB}/step-{step}", state=CopyState.VALID, at=T0,
                      event_id=f"copy-{step}", valid_since=T0)  # fmt: skip
    return base.model_copy(update={"copies": {copy.uri: copy}})


@pytest.mark.parametrize("present", [True, False])
async def test_a_primary_gone_at_decision_time_is_restored_from_its_verified_copy(
    store: FsStore, present: bool
) -> None:
    """Issue 29: the newest checkpoint's primary was wiped after its copy was made; the plan
    loads that same checkpoint from the copy (not an older one) and says why. A primary still
    there is planned as always."""
    newest, older = with_copy(store, 300), with_copy(store, 200)
    store.put(f"{JOB}/step-200/shard.bin", b"x")
    if present:
        store.put(f"{JOB}/step-300/shard.bin", b"x")
    world = World(store, newest, older)
    await world.handlers.on_started(started())
    await world.handlers.on_failed(failed())
    [plan] = world.data("resume.planned")
    assert plan.checkpoint_id == newest.checkpoint_id
    if present:
        assert plan.checkpoint_uri == newest.uri
        assert not any("copy" in r for r in plan.reasons)
    else:
        assert plan.checkpoint_uri == f"s3://copies/{JOB}/step-300"
        assert plan.reasons[0] == (
            f"primary {newest.uri} is missing (nothing left at its location): restoring from "
            f"its verified copy s3://copies/{JOB}/step-300"
        )


def lf(plan: Any, key: str, seconds: float) -> Envelope[Any]:
    data = ResumeLoadFailedV2(
        job_id=JOB, plan_id=plan.plan_id, run_id="run-1", checkpoint_id=plan.checkpoint_id,
        reason="checksum mismatch in shard 0", side=FailureSide.JOB, blame=LoadBlame.CHECKPOINT,
    )  # fmt: skip
    return ev(data, key, seconds)


async def test_a_primary_failing_at_load_is_restored_from_its_copy_before_anything_older(
    store: FsStore,
) -> None:
    """Issue 29: the newest checkpoint's primary is there at decision time but fails to load.
    The next plan restores the SAME checkpoint from its verified copy (and says so); the primary
    is quarantined. When that copy fails to load too, the copy is excluded (the primary's bytes
    were not read: nothing more is quarantined) and the one before is planned."""
    newest, older = with_copy(store, 300), with_copy(store, 200)
    for step in (200, 300):
        store.put(f"{JOB}/step-{step}/shard.bin", b"x")
    world = World(store, newest, older)
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    assert (first.checkpoint_id, first.checkpoint_uri) == (newest.checkpoint_id, newest.uri)
    await h.on_started(started(2, plan_id=first.plan_id))
    await h.on_load_failed(lf(first, "lf-2", 2100))
    [q] = world.data("checkpoint.quarantined")
    assert (q.checkpoint_id, q.uri) == (newest.checkpoint_id, newest.uri)
    second = world.data("resume.planned")[-1]
    copy = f"s3://copies/{JOB}/step-300"
    assert (second.attempt, second.checkpoint_id, second.checkpoint_uri) == (
        3,
        newest.checkpoint_id,
        copy,
    )
    assert second.fallback_from == newest.checkpoint_id
    assert second.fallbacks == 1
    assert second.reasons[0] == (
        f"primary {newest.uri} failed to load (excluded after a load failure): restoring from "
        f"its verified copy {copy}"
    )

    await h.on_started(started(3, plan_id=second.plan_id))
    await h.on_load_failed(lf(second, "lf-3", 3100))
    assert len(world.data("checkpoint.quarantined")) == 1  # a copy's failure moves no bytes
    third = world.data("resume.planned")[-1]
    assert (third.attempt, third.checkpoint_id, third.checkpoint_uri) == (
        4,
        older.checkpoint_id,
        older.uri,
    )
    assert third.fallback_from == newest.checkpoint_id
    assert await world.state.excluded(JOB) == {
        domain.exclusion(newest.checkpoint_id, newest.uri),
        domain.exclusion(newest.checkpoint_id, copy),
    }


async def test_a_gone_primary_whose_copy_failed_to_load_is_passed_over_at_once(
    store: FsStore,
) -> None:
    """The newest checkpoint's primary is gone, so the plan loads its copy; that copy fails to
    load. The next plan is the older checkpoint, never the gone primary (a restart and a
    fallback spent on a location that holds nothing)."""
    newest, older = with_copy(store, 300), with_copy(store, 200)
    store.put(f"{JOB}/step-200/shard.bin", b"x")
    world = World(store, newest, older)
    h = world.handlers
    await h.on_started(started())
    await h.on_failed(failed())
    [first] = world.data("resume.planned")
    assert first.checkpoint_uri == f"s3://copies/{JOB}/step-300"
    await h.on_started(started(2, plan_id=first.plan_id))
    await h.on_load_failed(lf(first, "lf-2", 2100))
    assert world.data("checkpoint.quarantined") == []  # the copy failed: no primary bytes read
    second = world.data("resume.planned")[-1]
    assert (second.attempt, second.checkpoint_id, second.checkpoint_uri) == (
        3,
        older.checkpoint_id,
        older.uri,
    )
    assert (second.fallback_from, second.fallbacks) == (newest.checkpoint_id, 1)
