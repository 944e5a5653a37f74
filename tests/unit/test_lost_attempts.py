"""Heartbeat deadlines (issue 16): the watch rules (`liveness`), the projection that keeps the
watch from job events, and the lost-attempt loop (`watchdog`) over the in-memory fakes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts import CATALOG, Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV2,
    JobHeartbeatV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    JobStartedV2,
    JobSucceededV1,
)
from ckpt_ha.core.tiers import LOST_FLOOR_S, MISSED_HEARTBEATS, TIERS, lost_after
from ckpt_ha.restore_coordinator import liveness
from ckpt_ha.restore_coordinator.app import compose_handlers
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.watchdog import LostAttempts
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.pins import InMemoryPins
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.restores import InMemoryRestores

JOB = "job-l"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def start(
    attempt: int = 1,
    *,
    run: str = "run-1",
    heartbeat_s: float | None = 1.0,
    deadline_s: float | None = 5.0,
    tier: str | None = None,
) -> JobStartedV2:
    return JobStartedV2(
        job_id=JOB, run_id=run, attempt=attempt, heartbeat_s=heartbeat_s,
        deadline_s=deadline_s, policy=JobPolicy(tier=tier),
    )  # fmt: skip


# --- the rules ---


def test_the_deadline_is_declared_else_a_few_missed_heartbeats_else_none() -> None:
    assert lost_after(start(deadline_s=7)) == 7
    # Four missed heartbeats (issue 28: a lost host is noticed within 60 s at the defaults),
    # never under the floor, never over the tier's ceiling.
    assert lost_after(start(heartbeat_s=10, deadline_s=None)) == 4 * 10 == 40
    assert lost_after(start(heartbeat_s=1, deadline_s=None)) == LOST_FLOOR_S == 30
    assert lost_after(start(heartbeat_s=60, deadline_s=None)) == 240
    assert lost_after(start(heartbeat_s=60, deadline_s=None, tier="critical")) == 60
    assert lost_after(start(heartbeat_s=60, deadline_s=None, tier="standard")) == 120
    assert TIERS["exploratory"].lost_after_s == 300
    assert lost_after(start(heartbeat_s=600, deadline_s=None, tier="gold")) == 300  # cheapest's
    assert MISSED_HEARTBEATS * 10 + 5 + 10 <= 60  # deadline + check interval + one beat
    assert lost_after(start(heartbeat_s=None)) is None
    v1 = CATALOG.decode(
        build(JobStartedV1(job_id=JOB, run_id="r"), source="t", time=T0, key="k")
        .model_dump_json()
        .encode()
    ).data
    assert isinstance(v1, JobStartedV2)  # upcast: promised nothing
    assert lost_after(v1) is None


def test_signs_of_life_move_the_deadline_forward_only() -> None:
    w = liveness.on_start(None, start(), at(0))
    assert w is not None
    assert w.due == at(5)
    w2 = liveness.on_alive(w, "run-1", 1, at(3), 40)
    assert w2 is not None
    assert (w2.due, w2.last_step) == (at(8), 40)
    assert liveness.on_alive(w2, "run-1", 1, at(2)) is None  # late, older: ignored
    assert liveness.on_alive(w2, "run-1", 2, at(9)) is None  # not the watched attempt
    assert liveness.on_alive(w2, "run-2", 1, at(9)) is None


def test_an_end_stops_the_watch_even_when_handled_before_the_start() -> None:
    w = liveness.on_start(None, start(), at(0))
    ended = liveness.on_end(w, JOB, "run-1", 1, at(4))
    assert ended is not None
    assert ended.ended
    assert ended.due is None
    assert liveness.on_end(ended, JOB, "run-1", 1, at(5)) is None
    # The failure of attempt 2 handled before its start: the late start arms nothing.
    tomb = liveness.on_end(ended, JOB, "run-1", 2, at(6))
    assert tomb is not None
    assert (tomb.attempt, tomb.ended) == (2, True)
    assert liveness.on_start(tomb, start(2), at(5)) is None
    assert liveness.on_start(None, start(heartbeat_s=None), at(0)).due is None  # type: ignore[union-attr]


def test_a_newer_attempt_or_a_later_run_supersedes_the_watch() -> None:
    w = liveness.on_start(None, start(1), at(0))
    newer = liveness.on_start(w, start(2), at(10))
    assert newer is not None
    assert (newer.attempt, newer.due) == (2, at(15))
    assert liveness.on_start(newer, start(1), at(20)) is None  # an older one, redelivered
    # The old attempt's end no longer touches the new one's watch.
    assert liveness.on_end(newer, JOB, "run-1", 1, at(11)) is None
    other = liveness.on_start(newer, start(1, run="run-2"), at(30))
    assert other is not None
    assert other.run_id == "run-2"
    assert liveness.on_start(other, start(5, run="run-1"), at(12)) is None  # started earlier
    unwatched = liveness.on_start(other, start(1, run="run-3", heartbeat_s=None), at(40))
    assert unwatched is not None
    assert unwatched.due is None


def test_lost_only_past_the_deadline_and_after_watching_that_long() -> None:
    w = liveness.on_start(None, start(), at(0))
    assert w is not None
    assert not liveness.lost(w, at(5), watching_s=100)  # not past it yet
    assert liveness.lost(w, at(5.1), watching_s=5)
    assert not liveness.lost(w, at(60), watching_s=4.9)  # the watcher only just came back
    event = liveness.lost_event(w, at(6))
    assert (event.cause, event.side, event.reported_by) == (
        FailureCause.LOST, FailureSide.INFRASTRUCTURE, "restore-coordinator"
    )  # fmt: skip
    assert liveness.event_key(w) == f"lost|{JOB}|run-1|1"


# --- the projection and the loop ---


class Coordinator:
    def __init__(self, tmp: Path, state: InMemoryRestores | None = None) -> None:
        self.pins = InMemoryPins()
        self.state = state if state is not None else InMemoryRestores(self.pins)
        self.bus = RecordingPublisher()
        (tmp / "store").mkdir(exist_ok=True)
        self.now = T0
        self.metrics = RestoreMetrics(ServiceMetrics("restore-coordinator"))
        self.handlers = compose_handlers(
            self.state, self.pins, InMemoryRegistry(), FsStore(tmp / "store"), self.bus,
            lambda: self.now, self.metrics,
        )  # fmt: skip
        self.pending = False

        async def backlog() -> bool:
            return self.pending

        self.loop = LostAttempts(
            self.state, self.handlers.projection, self.bus, lambda: self.now, self.metrics,
            backlog,
        )  # fmt: skip
        self.n = 0

    async def handle(self, data: EventData, handler: str, t: float) -> Envelope[EventData]:
        self.n += 1
        event = build(data, source="test", time=at(t), key=str(self.n))
        await getattr(self.handlers, handler)(event)
        return event

    async def round(self, t: float) -> list[str]:
        self.now = at(t)
        return [w.job_id for w in await self.loop.round()]

    def lost(self) -> list[JobFailedV2]:
        found = [e.data for e in self.bus.of_type("job.failed")]
        return [d for d in found if isinstance(d, JobFailedV2)]


async def test_a_silent_attempt_is_declared_lost_once(tmp_path: Path) -> None:
    c = Coordinator(tmp_path)
    await c.handle(start(deadline_s=5), "on_started", 0)
    await c.handle(JobProgressV1(job_id=JOB, run_id="run-1", attempt=1, step=12), "on_progress", 2)
    assert await c.round(1) == []  # starts watching
    assert await c.round(6.5) == []  # due at 7 (last progress at 2)
    assert await c.round(7.5) == [JOB]
    (event,) = c.lost()
    assert (event.cause, event.attempt, event.last_step, event.reported_by) == (
        FailureCause.LOST, 1, 12, "restore-coordinator"
    )  # fmt: skip
    assert "no progress and no heartbeat" in event.detail
    assert await c.round(30) == []  # once per attempt
    assert c.metrics.lost.labels("restore-coordinator")._value.get() == 1
    watch = await c.state.watch(JOB)
    assert watch is not None
    assert watch.ended
    # The event coming back on the failed consumer is one more end: nothing changes; the
    # failure is then decided like any other (here: nothing valid to restore, escalated).
    (published,) = c.bus.of_type("job.failed")
    await c.handlers.on_failed(published)
    assert c.bus.of_type("resume.escalated")
    assert await c.round(60) == []


async def test_heartbeats_keep_a_slow_attempt_alive(tmp_path: Path) -> None:
    c = Coordinator(tmp_path)
    await c.handle(start(heartbeat_s=1, deadline_s=3), "on_started", 0)
    assert await c.round(0) == []
    for t in range(1, 30):
        beat = JobHeartbeatV1(job_id=JOB, run_id="run-1", attempt=1, sequence=t)
        await c.handle(beat, "on_heartbeat", t)
        assert await c.round(t + 0.5) == []
    assert await c.round(32.5) == [JOB]  # and once they stop, it is lost


async def test_no_declaration_while_job_events_are_pending_or_after_a_restart(
    tmp_path: Path,
) -> None:
    c = Coordinator(tmp_path)
    await c.handle(start(deadline_s=5), "on_started", 0)
    c.pending = True
    assert await c.round(10) == []  # a backlog (perhaps its heartbeats): nothing declared
    c.pending = False
    assert await c.round(11) == []  # watching for 1 s only: less than its 5 s deadline
    assert await c.round(15.5) == [JOB]
    # A restarted coordinator over the same state: watches a full deadline first.
    c2 = Coordinator(tmp_path, c.state)
    await c2.handle(start(2, deadline_s=5), "on_started", 20)
    assert await c2.round(100) == []
    assert await c2.round(104) == []
    assert await c2.round(105.5) == [JOB]
    # A round that cannot read the consumers (the bus is away) starts the clock again.
    await c2.handle(start(3, deadline_s=5), "on_started", 110)

    async def unreachable() -> bool:
        raise OSError("nats: no servers")

    c2.loop.backlog = unreachable
    with pytest.raises(OSError, match="no servers"):
        await c2.round(200)

    async def back() -> bool:
        return False

    c2.loop.backlog = back
    assert await c2.round(201) == []
    assert await c2.round(206.5) == [JOB]


async def test_success_failure_and_unpromised_heartbeats_are_never_lost(
    tmp_path: Path,
) -> None:
    c = Coordinator(tmp_path)
    await c.handle(start(deadline_s=5), "on_started", 0)
    await c.handle(JobSucceededV1(job_id=JOB, run_id="run-1", attempt=1), "on_succeeded", 1)
    assert await c.round(0) == []
    assert await c.round(100) == []
    c2 = Coordinator(tmp_path)
    await c2.handle(start(heartbeat_s=None, deadline_s=None), "on_started", 0)
    assert await c2.round(0) == []
    assert await c2.round(10_000) == []


@pytest.mark.parametrize("failure_first", [True, False])
async def test_a_runner_reported_failure_ends_the_watch_in_either_order(
    tmp_path: Path, failure_first: bool
) -> None:
    c = Coordinator(tmp_path)
    failed = JobFailedV2(job_id=JOB, run_id="run-1", attempt=1, cause=FailureCause.ERROR)
    first, second = (failed, start()), (start(), failed)
    for data in first if failure_first else second:
        if isinstance(data, JobStartedV2):
            await c.handle(data, "on_started", 0)
        else:
            await c.handlers.projection.ended(build(data, source="test", time=at(1), key="f"))
    assert await c.round(0) == []
    assert await c.round(100) == []


async def test_a_reporter_whose_clock_is_behind_is_not_lost_while_it_reports(
    tmp_path: Path,
) -> None:
    """Its events say an hour ago; the coordinator heard them just now: alive. Once they stop
    for the deadline on the coordinator's own clock, lost."""
    c = Coordinator(tmp_path)
    behind = -3600.0
    c.now = at(0)
    await c.handle(start(heartbeat_s=1, deadline_s=3), "on_started", behind)
    assert await c.round(0) == []
    for t in range(1, 10):
        c.now = at(t)
        beat = JobHeartbeatV1(job_id=JOB, run_id="run-1", attempt=1, sequence=t)
        await c.handle(beat, "on_heartbeat", behind + t)
        assert await c.round(t + 0.5) == []
    assert await c.round(11.5) == []  # heard at 9: 2.5 s ago
    assert await c.round(12.5) == [JOB]
