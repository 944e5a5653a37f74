"""The retention-janitor's own view of resumes (R6, R15): the projection of every event it reads
(pure), idempotent on redelivery and replay, any order of its consumers where order cannot be
promised; the in-memory store passes the contract suite the Redis owner passes
(``tests/integration/test_retention_view_redis.py``); the handlers keep the view and a round
or a registration waits for the view to catch up."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointIdentity,
    CheckpointRegisteredV1,
    CheckpointState,
)
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.contracts.resume import (
    Compatibility,
    ResumeClosedV1,
    ResumeDivergedV1,
    ResumeEscalatedV2,
    ResumeLoadedV1,
    ResumeMode,
    ResumePlannedV1,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.retention_janitor import domain, projection, resumes
from ckpt_ha.retention_janitor.domain import ProtectionKind
from ckpt_ha.retention_janitor.handlers import Janitor, JanitorHandlers, ResumesBehind
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.resumes import JobResumes
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.resumes import InMemoryResumes, SettableFeed
from tests.support.resume_view_contract import KEEP_S, ResumeViewContract

JOB = "job-v"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
_ids = itertools.count()


def event(data: EventData, at: datetime = T0) -> Envelope[EventData]:
    return build(data, source="test", time=at, key=f"e{next(_ids)}")


def planned(
    plan: str, attempt: int, ckpt: str, step: int, pinned: tuple[str, ...], *, v1: bool = False
) -> EventData:
    kind = ResumePlannedV1 if v1 else ResumePlannedV2
    return kind(
        job_id=JOB, plan_id=plan, failed_run_id="run-1", attempt=attempt, checkpoint_id=ckpt,
        checkpoint_uri=f"file:///data/{JOB}/{ckpt}", step=step, mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL, pinned=pinned,
    )  # fmt: skip


def started(attempt: int, plan: str | None) -> EventData:
    return JobStartedV1(job_id=JOB, run_id="run-1", attempt=attempt, plan_id=plan)


def registered(
    ckpt: str, step: int, attempt: int | None, state: CheckpointState = CheckpointState.VALID
) -> EventData:
    identity = CheckpointIdentity(job_id=JOB, run_id="run-1", attempt=attempt) if attempt else None
    return CheckpointRegisteredV1(
        job_id=JOB, checkpoint_id=ckpt, uri=f"file:///data/{JOB}/{ckpt}", step=step,
        state=state, identity=identity,
    )  # fmt: skip


def verified(plan: str) -> EventData:
    return ResumeVerifiedV1(job_id=JOB, plan_id=plan, run_id="run-1", checkpoint_id="c", step=1)


def diverged(plan: str) -> EventData:
    return ResumeDivergedV1(
        job_id=JOB, plan_id=plan, run_id="run-1", checkpoint_id="c", step=1, reason="loss"
    )


def replay(events: list[Envelope[EventData]], view: JobResumes | None = None) -> JobResumes:
    view = view or JobResumes()
    for e in events:
        view = projection.apply(view, e, KEEP_S)
    return view


def refs(view: JobResumes, now: datetime = T0) -> list[tuple[str, str, str]]:
    return [
        (p.checkpoint_id, p.kind.value, p.ref) for p in domain.resume_protections(view, now, KEEP_S)
    ]


# --- the projection, event by event ---------------------------------------------------------


@pytest.mark.parametrize("v1", [False, True])
def test_a_plan_protects_its_checkpoint_and_pins_its_fallbacks(v1: bool) -> None:
    view = replay([event(planned("p-1", 2, "c300", 300, ("c300", "c200"), v1=v1))])
    assert refs(view) == [
        ("c200", "fallback", "fallback for plan p-1"),
        ("c300", "fallback", "restored from for plan p-1"),
        ("c300", "restore_plan", "plan p-1"),
    ]


def test_the_resumed_attempts_start_makes_the_plan_a_resume_in_progress() -> None:
    view = replay([event(planned("p-1", 2, "c300", 300, ())), event(started(2, "p-1"))])
    assert refs(view) == [("c300", "resume", "attempt 2 of plan p-1")]
    # A start of the attempt number that names no plan (a new run reusing it) unmarks it.
    assert refs(replay([event(started(2, None))], view)) == [("c300", "restore_plan", "plan p-1")]
    # Another attempt's start changes nothing.
    assert refs(replay([event(started(3, "p-9"))], view)) == refs(view)


@pytest.mark.parametrize("verdict", [verified, diverged])
def test_a_verdict_ends_the_plan_but_not_its_pins(verdict: object) -> None:
    assert callable(verdict)
    view = replay([event(planned("p-1", 2, "c300", 300, ("c300",))), event(verdict("p-1"))])
    assert refs(view) == [("c300", "fallback", "restored from for plan p-1")]


def test_a_newer_valid_checkpoint_of_the_resumed_attempt_releases_the_pins() -> None:
    view = replay([event(planned("p-1", 3, "c300", 300, ("c300", "c200")))])
    kept = [
        registered("c250", 250, 3),  # not past the restored step
        registered("c400", 400, 2),  # written by an attempt before the resumed one
        registered("c400", 400, 3, CheckpointState.CORRUPT),  # not valid
    ]
    assert replay([event(d) for d in kept], view) == view
    assert resumes.pins(replay([event(registered("c400", 400, 3))], view)) == []
    assert resumes.pins(replay([event(registered("c400", 400, 4))], view)) == []
    # Without an identity, any newer valid checkpoint of the job releases them.
    assert resumes.pins(replay([event(registered("c400", 400, None))], view)) == []


def test_a_registration_older_than_the_plan_releases_none_of_its_pins() -> None:
    """A consumer replaying the stream from its start (new in a release) meets a job's earlier
    registrations after every plan: one registered before a plan leaves that plan's pins."""
    later = T0 + timedelta(minutes=5)
    view = replay([event(planned("p-1", 2, "c300", 300, ("c300",)), later)])
    assert replay([event(registered("c400", 400, None), T0)], view) == view
    assert resumes.pins(replay([event(registered("c400", 400, None), later)], view)) == []


def test_events_that_do_not_concern_the_view_change_nothing() -> None:
    view = replay([event(planned("p-1", 2, "c300", 300, ("c300",)))])
    others: list[EventData] = [
        ResumeLoadedV1(job_id=JOB, plan_id="p-1", run_id="run-1", checkpoint_id="c300", step=3),
        ResumeClosedV1(job_id=JOB, plan_id="p-1"),
        ResumeEscalatedV2(job_id=JOB, plan_id="p-1", reason="r", next_step="n", attempt=2),
        started(1, None),
    ]
    assert replay([event(d) for d in others], view) == view
    assert replay([event(started(1, None))]) == JobResumes()


def test_a_plan_without_verdict_stops_protecting_after_keep_s_from_its_last_event() -> None:
    late = T0 + timedelta(seconds=KEEP_S / 2)
    view = replay([event(planned("p-1", 2, "c300", 300, ())), event(started(2, "p-1"), late)])
    assert refs(view, T0 + timedelta(seconds=KEEP_S)) != []
    assert refs(view, late + timedelta(seconds=KEEP_S + 1)) == []
    # And the job's next event forgets it; its pins stay until released.
    pinned = replay([event(planned("p-2", 3, "c400", 400, ("c400",)), T0)])
    later = T0 + timedelta(seconds=KEEP_S + 1)
    after = replay([event(started(9, None), later)], pinned)
    assert after.plans == {}
    assert resumes.pins(after) == resumes.pins(pinned)


# --- idempotent, and order-insensitive where order is not promised ---------------------------


def history() -> list[Envelope[EventData]]:
    return [
        event(started(1, None)),
        event(planned("p-2", 2, "c300", 300, ("c300", "c200"))),
        event(started(2, "p-2")),
        event(registered("c310", 310, 1)),  # the failed attempt's: releases nothing
        event(planned("p-3", 3, "c200", 200, ("c200", "c100"))),  # the fallback
        event(started(3, "p-3")),
        event(verified("p-3")),
        event(registered("c400", 400, 3)),  # releases every pin
        event(planned("p-4", 4, "c400", 400, ("c400", "c200"))),
    ]


def test_every_event_delivered_twice_gives_the_same_view() -> None:
    events = history()
    once = replay(events)
    twice = replay([e for e in events for e in (e, e)])
    assert twice == once
    assert replay(events, once) == once  # a whole replay over the view changes nothing
    assert refs(once) == [
        ("c200", "fallback", "fallback for plan p-4"),
        ("c400", "fallback", "restored from for plan p-4"),
        ("c300", "resume", "attempt 2 of plan p-2"),
        ("c400", "restore_plan", "plan p-4"),
    ]  # p-2's attempt failed without a verdict: kept, as the coordinator's stored plan was


def test_a_plan_redelivered_after_a_registration_released_its_pins_does_not_pin_again() -> None:
    plan = event(planned("p-1", 2, "c300", 300, ("c300", "c200")))
    view = replay([plan, event(registered("c400", 400, 2)), plan])
    assert resumes.pins(view) == []


def test_a_verdict_before_its_plan_still_ends_it_and_the_start_may_come_first() -> None:
    plan = event(planned("p-1", 2, "c300", 300, ("c300",)))
    verdict, start = event(verified("p-1")), event(started(2, "p-1"))
    in_order = replay([plan, start, verdict])
    for order in itertools.permutations([plan, start, verdict]):
        assert replay(list(order)) == in_order
    assert refs(in_order) == [("c300", "fallback", "restored from for plan p-1")]


# --- the store's contract, on the fake --------------------------------------------------------


class TestInMemoryResumes(ResumeViewContract):
    @pytest.fixture
    def view(self) -> InMemoryResumes:
        return InMemoryResumes(keep_s=KEEP_S)


# --- the handlers -----------------------------------------------------------------------------


class World:
    def __init__(self, tmp_path: Path) -> None:
        (tmp_path / "s").mkdir()
        self.registry = InMemoryRegistry()
        self.view = InMemoryResumes(keep_s=KEEP_S)
        self.feed = SettableFeed()
        self.bus = RecordingPublisher()
        self.janitor = Janitor(
            self.registry, self.view, self.feed, FsStore(tmp_path / "s"), self.bus,
            lambda: T0 + timedelta(days=30), RetentionMetrics(ServiceMetrics("retention-janitor")),
        )  # fmt: skip
        self.handlers = JanitorHandlers(self.janitor)


async def test_the_handlers_keep_the_view_from_every_event(tmp_path: Path) -> None:
    """What the consumers keep is the projection of what they consumed."""
    world = World(tmp_path)
    plan, start = event(planned("p-1", 2, "c300", 300, ("c300", "c200"))), event(started(2, "p-1"))
    release, verdict = event(registered("c400", 400, 2)), event(verified("p-1"))
    await world.handlers.resumes.on_event(plan)
    await world.handlers.on_started(start)  # type: ignore[arg-type]
    assert await world.view.resumes(JOB) == replay([plan, start])
    assert [p.resuming for p in resumes.in_progress(replay([plan, start]), T0, KEEP_S)] == [True]
    await world.handlers.on_released(release)  # type: ignore[arg-type]
    await world.handlers.resumes.on_event(verdict)
    assert await world.view.resumes(JOB) == replay([plan, start, release, verdict])
    assert refs(await world.view.resumes(JOB)) == []


async def test_no_round_and_no_release_before_the_view_has_caught_up(tmp_path: Path) -> None:
    """A plan the coordinator published may not be in the view yet: a round would not see it,
    and a registration would release nothing of it. Both wait (the registration is redelivered)."""
    world = World(tmp_path)
    world.registry.put(
        CheckpointRecord(
            checkpoint_id="c1", job_id=JOB, run_id="run-1", step=1, uri="file:///x/c1",
            state=CheckpointState.VALID, created_at=T0, updated_at=T0,
        )
    )  # fmt: skip
    await world.handlers.resumes.on_event(event(planned("p-1", 2, "c300", 300, ("c300",))))
    world.feed.behind = True
    with pytest.raises(ResumesBehind):
        await world.janitor.run_once()
    for handle in (world.handlers.on_registered, world.handlers.on_released):
        with pytest.raises(ResumesBehind):
            await handle(event(registered("c400", 400, 2)))  # type: ignore[arg-type]
    assert [p.checkpoint_id for p in resumes.pins(await world.view.resumes(JOB))] == ["c300"]
    assert world.bus.events == []
    world.feed.behind = False
    await world.handlers.on_released(event(registered("c400", 400, 2)))  # type: ignore[arg-type]
    assert resumes.pins(await world.view.resumes(JOB)) == []
    assert (await world.janitor.run_once()).decisions[0].protected_by[0].kind is (
        ProtectionKind.LAST_VALID
    )
