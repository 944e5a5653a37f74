"""The behaviour every store of the restore-coordinator's state must show, written once and run
against the in-memory fake and the Redis owner (`ckpt_ha.restore_coordinator.store.RedisRestores`).

Subclass `RestoresContract` in a `Test*` class and give it a `stores` fixture returning an empty
``(state, pins)`` pair wired together (the state writes a decision's pins through the pins
owner), with a trajectory limit of `TRAJECTORY_LIMIT`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckpt_ha.contracts.job import JobPolicy
from ckpt_ha.core.pins import Pin
from ckpt_ha.restore_coordinator.records import (
    DecisionRecord,
    DecisionWrite,
    Failure,
    PlanRecord,
    Point,
    Started,
    Watch,
)

TRAJECTORY_LIMIT = 5
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def point(step: int, attempt: int = 1, **metrics: float) -> Point:
    return Point(step, at(step), attempt, step * 64, f"rng-{step}", metrics)


def plan(plan_id: str, job: str = "job-a", attempt: int = 2, ckpt: str = "c-300") -> PlanRecord:
    return PlanRecord(
        plan_id=plan_id,
        job_id=job,
        failed_run_id="run-1",
        failed_attempt=attempt - 1,
        attempt=attempt,
        checkpoint_id=ckpt,
        step=300,
        failed_at=at(1000),
        policy=JobPolicy(max_restarts=7),
    )


class RestoresContract:
    @pytest.fixture
    def stores(self) -> tuple[Any, Any]:
        raise NotImplementedError("backend test classes provide the state and its pins")

    async def test_started_round_trips_per_attempt(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        s = Started(run_id="r", attempt=2, at=T0, policy=JobPolicy(max_restarts=9), plan_id="p")
        await state.record_started("job-a", s)
        assert await state.started("job-a", 2) == s
        assert await state.started("job-a", 1) is None
        assert await state.started("job-b", 2) is None

    async def test_a_hold_is_kept_until_unheld_per_job(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        assert not await state.held("job-a")
        await state.set_held("job-a", True)
        await state.set_held("job-a", True)  # twice is once
        assert await state.held("job-a")
        assert not await state.held("job-b")
        await state.set_held("job-a", False)
        assert not await state.held("job-a")
        await state.set_held("job-a", False)  # unholding a job not held changes nothing
        assert not await state.held("job-a")

    async def test_attention_keeps_the_later_events_word(self, stores: tuple[Any, Any]) -> None:
        """A job's attention record is set and cleared by events: an older event (handled
        late by another consumer) neither brings back what ended nor ends what came after; a
        clear of one status leaves another alone."""
        state, _ = stores
        assert await state.attention() == []
        await state.attend("job-a", "escalated", "restart_loop", at(10))
        await state.attend("job-b", "lost", "", at(10))
        await state.settle("job-a", at(5))  # a start handled late: older than the escalation
        await state.settle("job-b", at(20), only="escalated")  # a plan: not what job-b needs
        await state.settle("job-c", at(20))  # nothing to settle
        found = await state.attention()
        assert [(a.job_id, a.status, a.reason, a.since) for a in found] == [
            ("job-a", "escalated", "restart_loop", at(10)),
            ("job-b", "lost", "", at(10)),
        ]
        await state.attend("job-a", "diverged", "", at(8))  # older: refused
        await state.settle("job-a", at(10))  # the same time: settles
        await state.settle("job-b", at(30))
        assert await state.attention() == []
        await state.attend("job-a", "diverged", "", at(40))
        await state.attend("job-a", "escalated", "fallbacks_exhausted", at(50))  # later: kept
        (only,) = await state.attention()
        assert (only.status, only.reason) == ("escalated", "fallbacks_exhausted")

    async def test_ending_a_run_keeps_its_starts_readable(self, stores: tuple[Any, Any]) -> None:
        """The run's end only lets its starts expire later (with the rest of the state): a
        failure heard late, or a closure, still finds them."""
        state, _ = stores
        starts = [Started(run_id="r", attempt=a, at=T0) for a in (1, 2)]
        for s in starts:
            await state.record_started("job-a", s)
        await state.end_run("job-a", 2)
        assert [await state.started("job-a", a) for a in (1, 2)] == starts

    async def test_trajectory_is_bounded_oldest_steps_first(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        points = [point(s, loss=1.0 / s) for s in range(1, 9)]
        await state.record_progress("job-a", points[:4], last=points[3])
        await state.record_progress("job-a", points[4:], last=points[7])
        assert await state.point_at("job-a", 8) == points[7]
        assert await state.point_at("job-a", 3) is None  # trimmed: only the newest 5 steps stay
        assert await state.point_at("job-a", 4) == points[3]
        assert await state.last("job-a", 1) == points[7]
        assert await state.last("job-a", 2) is None
        # the asked-for steps it still has, plus its highest step
        assert await state.trajectory("job-a", [2, 5, 6]) == {
            5: points[4],
            6: points[5],
            8: points[7],
        }
        assert await state.trajectory("job-b", [1]) == {}

    async def test_last_progress_alone_leaves_the_trajectory(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        await state.record_progress("job-a", [], last=point(50, attempt=2))
        assert await state.last("job-a", 2) == point(50, attempt=2)
        assert await state.trajectory("job-a", [50]) == {}

    async def test_observe_keeps_the_first_reports_in_arrival_order(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, _ = stores
        assert await state.observe("p", point(302), 2) == [point(302)]
        assert await state.observe("p", point(301), 2) == [point(302), point(301)]
        assert await state.observe("p", point(303), 2) == [point(302), point(301)]
        assert await state.observe("q", point(1), 2) == [point(1)]

    async def test_the_first_verdict_wins(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        assert await state.verdict("p") is None
        assert await state.set_verdict("p", "verified") is True
        assert await state.set_verdict("p", "diverged") is False
        assert await state.verdict("p") == "verified"

    async def test_failure_context_records_once_and_reads_the_window(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, _ = stores
        s3 = Started(run_id="r", attempt=3, at=T0)
        await state.record_started("job-a", s3)
        await state.record_progress("job-a", [], last=point(30, attempt=3))
        for attempt in (1, 2):
            await state.failure_context(
                "job-a", attempt, Failure(attempt, at(attempt), "x"), None, 8
            )
        f3 = Failure(3, at(3), "oom", infrastructure=True)
        for _ in range(2):  # heard twice: one failure
            started, last, history, excluded, decision = await state.failure_context(
                "job-a", 3, f3, "failed:3", 2
            )
        assert (started, last, excluded, decision) == (s3, point(30, attempt=3), set(), None)
        assert list(history.failures) == [Failure(2, at(2), "x"), f3]  # the latest 2
        assert list(history.storage_errors) == [at(3)]
        assert list(history.restarts) == []
        assert history.fallbacks == 0
        assert await state.failures("job-a") == [
            Failure(1, at(1), "x"),
            Failure(2, at(2), "x"),
            f3,
        ]
        assert await state.failures("job-b") == []

    async def test_storage_errors_and_history(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        await state.record_storage_error("job-a", "load:p2", at(20))
        await state.record_storage_error("job-a", "load:p1", at(10))
        await state.record_storage_error("job-a", "load:p1", at(10))  # same key: one error
        await state.failure_context("job-a", 1, Failure(1, at(5)), None, 4)
        history = await state.history("job-a", 2, 4)
        assert list(history.storage_errors) == [at(10), at(20)]
        assert list(history.failures) == [Failure(1, at(5))]

    async def test_exclusions_accumulate_per_job(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        assert await state.exclude("job-a", "c1") == {"c1"}
        assert await state.exclude("job-a", "c2") == {"c1", "c2"}
        assert await state.exclude("job-b", "c9") == {"c9"}
        assert await state.excluded("job-a") == {"c1", "c2"}
        assert await state.excluded("job-z") == set()
        _, _, _, excluded, _ = await state.failure_context("job-a", 1, Failure(1, T0), None, 4)
        assert excluded == {"c1", "c2"}

    async def test_a_lease_has_one_holder_until_released_or_expired(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, _ = stores
        assert await state.lease("job-a", 1, "me", 30.0) is True
        assert await state.lease("job-a", 1, "other", 30.0) is False
        assert await state.lease("job-a", 2, "other", 30.0) is True
        await state.release("job-a", 1)
        assert await state.lease("job-a", 1, "other", 0.05) is True
        await asyncio.sleep(0.15)
        assert await state.lease("job-a", 1, "third", 30.0) is True

    async def test_a_decision_is_stored_with_its_plan_restart_and_pins(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, pins = stores
        decision = DecisionRecord(events=('{"a":1}', '{"b":2}'))
        pinned = [
            Pin("c-300", "restored from", "p1", 300, 2),
            Pin("c-200", "fallback", "p1", 300, 2),
        ]
        await state.record_decision(
            "job-a", 1, decision, plan=plan("p1"), pins=pinned, planned_at=at(900)
        )
        assert await state.decision("job-a", 1) == decision
        assert await state.decision("job-a", 2) is None
        assert await state.plan("p1") == plan("p1")
        assert await state.plan("p2") is None
        assert await pins.pins("job-a") == sorted(pinned, key=lambda p: p.checkpoint_id)
        history = await state.history("job-a", 1, 4)
        assert list(history.restarts) == [at(900)]
        # an escalation: a decision without plan or pins
        await state.record_decision("job-a", 2, DecisionRecord(events=('{"c":3}',)))
        assert list((await state.history("job-a", 2, 4)).restarts) == [at(900)]
        _, _, _, _, found = await state.failure_context("job-a", 2, Failure(2, T0), None, 4)
        assert found == DecisionRecord(events=('{"c":3}',))

    async def test_recent_restarts_count_the_stored_plans_per_job(
        self, stores: tuple[Any, Any]
    ) -> None:
        """The level the restart-loop page reads: plans stored by any replica, per job, from a
        time on; an escalation is no restart, a job without restarts is absent."""
        state, _ = stores
        assert await state.recent_restarts(at(0)) == {}
        for attempt, (plan_id, s) in enumerate((("p1", 100), ("p2", 900), ("p3", 950)), 1):
            planned = plan(plan_id, attempt=attempt + 1)
            await state.record_decision(
                "job-a", attempt, DecisionRecord(events=()), plan=planned, planned_at=at(s)
            )
        await state.record_decision(
            "job-b", 1, DecisionRecord(events=()), plan=plan("q1", job="job-b"), planned_at=at(920)
        )
        await state.record_decision("job-c", 1, DecisionRecord(events=('{"e":1}',)))
        assert await state.recent_restarts(at(0)) == {"job-a": 3, "job-b": 1}
        assert await state.recent_restarts(at(900)) == {"job-a": 2, "job-b": 1}
        assert await state.recent_restarts(at(930)) == {"job-a": 1}
        assert await state.recent_restarts(at(1000)) == {}
        await state.set_held("job-a", True)  # held: no more restarts, the page ends
        assert await state.recent_restarts(at(0)) == {"job-b": 1}
        await state.set_held("job-a", False)
        assert await state.recent_restarts(at(0)) == {"job-a": 3, "job-b": 1}

    async def test_mark_published_keeps_the_events(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        decision = DecisionRecord(events=('{"a":1}',))
        await state.record_decision("job-a", 1, decision)
        await state.mark_published("job-a", 1, decision)
        assert await state.decision("job-a", 1) == DecisionRecord(
            events=('{"a":1}',), published=True
        )

    async def test_watch_round_trips_and_overdue_lists_only_live_deadlines(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, _ = stores
        assert await state.watch("job-w") is None
        live = Watch(job_id="job-w", run_id="r", attempt=1, started_at=T0, seen=T0, deadline_s=30)
        later = live.model_copy(update={"job_id": "job-x", "seen": at(10)})
        silent = live.model_copy(update={"job_id": "job-y", "deadline_s": None})
        for w in (later, live, silent):
            assert await state.update_watch(w.job_id, lambda _, w=w: w) == w
        assert await state.watch("job-w") == live
        assert await state.overdue(at(29), 10) == []
        assert await state.overdue(at(45), 10) == [live, later]
        assert await state.overdue(at(45), 1) == [live]
        # Unchanged (None) leaves it; an ended watch is no longer due.
        assert await state.update_watch("job-w", lambda _: None) is None
        assert await state.watch("job-w") == live
        await state.update_watch("job-w", lambda w: w.model_copy(update={"ended": True}))
        assert [w.job_id for w in await state.overdue(at(45), 10)] == ["job-x"]
        assert (await state.watch("job-w")).ended

    async def test_concurrent_watch_updates_are_not_lost(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        first = Watch(job_id="job-c", run_id="r", attempt=1, started_at=T0, seen=T0, last_step=0)
        await state.update_watch("job-c", lambda _: first)

        def bump(w: Watch | None) -> Watch | None:
            assert w is not None
            return w.model_copy(update={"last_step": (w.last_step or 0) + 1})

        await asyncio.gather(*(state.update_watch("job-c", bump) for _ in range(20)))
        assert (await state.watch("job-c")).last_step == 20

    async def test_heard_keeps_the_latest_and_goes_with_its_watch(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, _ = stores
        assert await state.last_heard([]) == {}
        await state.heard("job-h|r|1", at(10))
        await state.heard("job-h|r|1", at(5))  # an older note never wins
        await state.heard("job-h|r|2", at(7))
        assert await state.last_heard(["job-h|r|1", "job-h|r|2", "job-h|r|3"]) == {
            "job-h|r|1": at(10),
            "job-h|r|2": at(7),
        }
        w1 = Watch(job_id="job-h", run_id="r", attempt=1, started_at=T0, seen=T0, deadline_s=9)
        await state.update_watch("job-h", lambda _: w1)
        assert await state.last_heard(["job-h|r|1"]) == {"job-h|r|1": at(10)}  # still watched
        # A newer attempt supersedes it: the old note goes, the new attempt's stays.
        w2 = w1.model_copy(update={"attempt": 2})
        await state.update_watch("job-h", lambda _: w2)
        assert await state.last_heard(["job-h|r|1", "job-h|r|2"]) == {"job-h|r|2": at(7)}
        await state.update_watch("job-h", lambda w: w.model_copy(update={"ended": True}))
        assert await state.last_heard(["job-h|r|2"]) == {}

    async def test_a_batch_of_progress_lands_as_one_report_after_another(
        self, stores: tuple[Any, Any]
    ) -> None:
        """`record_progress_many` leaves what `record_progress` of each report in turn leaves:
        a step reported twice keeps the later point, each attempt its latest point, and each
        job's trajectory its bound."""
        state, _ = stores
        again = point(3, loss=0.5)
        await state.record_progress_many(
            {
                "job-a": [point(1), point(2), point(3), again, point(4, attempt=2)],
                "job-b": [point(7)],
                "job-c": [],
            }
        )
        assert await state.trajectory("job-a", [1, 2, 3]) == {
            1: point(1),
            2: point(2),
            3: again,
            4: point(4, attempt=2),
        }
        assert (await state.last("job-a", 1), await state.last("job-a", 2)) == (
            again,
            point(4, attempt=2),
        )
        assert await state.last("job-b", 1) == point(7)
        await state.record_progress_many({"job-a": [point(s) for s in range(5, 9)]})
        assert await state.point_at("job-a", 3) is None  # trimmed: only the newest 5 steps stay
        assert await state.point_at("job-a", 4) == point(4, attempt=2)
        assert await state.point_at("job-a", 8) == point(8)

    async def test_plans_and_verdicts_are_read_many_at_once(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        await state.record_decision("job-a", 1, DecisionRecord(events=()), plan=plan("p1"))
        await state.record_decision("job-a", 2, DecisionRecord(events=()), plan=plan("p2"))
        await state.set_verdict("p2", "diverged")
        assert await state.plans_of([]) == {}
        assert await state.plans_of(["p2", "nope", "p1", "p2"]) == {
            "p1": plan("p1"),
            "p2": plan("p2"),
        }
        assert await state.verdicts_of(["p1", "p2", "nope"]) == {"p2": "diverged"}

    async def test_watches_of_several_jobs_change_together(self, stores: tuple[Any, Any]) -> None:
        """`update_watches` is `update_watch` of each job (None: that job's is left alone),
        and two batches racing on the same jobs lose no change."""
        state, _ = stores
        w = Watch(job_id="job-1", run_id="r", attempt=1, started_at=T0, seen=T0, deadline_s=30)
        assert await state.update_watches({}) == {}
        first = {
            f"job-{i}": w.model_copy(update={"job_id": f"job-{i}", "last_step": 0}) for i in (1, 2)
        }
        written = await state.update_watches({j: (lambda _, x=x: x) for j, x in first.items()})
        assert written == first
        assert await state.update_watches({"job-1": lambda _: None}) == {"job-1": None}
        assert await state.watch("job-1") == first["job-1"]

        def bump(w: Watch | None) -> Watch | None:
            assert w is not None
            return w.model_copy(update={"last_step": (w.last_step or 0) + 1})

        await asyncio.gather(
            *(state.update_watches({"job-1": bump, "job-2": bump}) for _ in range(10))
        )
        assert [(await state.watch(j)).last_step for j in first] == [10, 10]
        assert [w.job_id for w in await state.overdue(at(45), 10)] == ["job-1", "job-2"]

    async def test_heard_many_keeps_the_latest_of_each(self, stores: tuple[Any, Any]) -> None:
        state, _ = stores
        await state.heard_many({})
        await state.heard_many({"j|r|1": at(10), "j|r|2": at(3)})
        await state.heard_many({"j|r|1": at(5), "j|r|2": at(4)})  # an older note never wins
        assert await state.last_heard(["j|r|1", "j|r|2"]) == {"j|r|1": at(10), "j|r|2": at(4)}

    async def test_a_round_of_failures_is_recorded_and_read_as_each_alone(
        self, stores: tuple[Any, Any]
    ) -> None:
        """`failure_contexts` (a burst's round): the same contexts, in their order, as
        `failure_context` of each, one after another."""
        state, _ = stores
        s2 = Started(run_id="r", attempt=2, at=T0)
        await state.record_started("job-a", s2)
        await state.record_progress("job-a", [], last=point(20, attempt=2))
        await state.exclude("job-b", "c-1")
        await state.record_decision("job-b", 1, DecisionRecord(events=('{"d":1}',)))
        await state.failure_context("job-a", 1, Failure(1, at(1), "x"), None, 8)
        f2 = Failure(2, at(2.125), "oom", infrastructure=True)
        round_ = [
            ("job-a", 2, f2, "failed:2"),
            ("job-b", 1, Failure(1, at(3)), None),
            ("job-c", 4, Failure(4, at(4)), None),
        ]
        got = await state.failure_contexts(round_, 8)
        assert got[0] == (
            s2,
            point(20, attempt=2),
            got[0][2],
            set(),
            None,
        )
        assert list(got[0][2].failures) == [Failure(1, at(1), "x"), f2]
        assert list(got[0][2].storage_errors) == [at(2.125)]
        assert (got[1][3], got[1][4]) == ({"c-1"}, DecisionRecord(events=('{"d":1}',)))
        assert got[2][0] is None
        assert list(got[2][2].failures) == [Failure(4, at(4))]
        assert await state.failure_contexts(round_, 8) == got  # heard again: the same
        assert await state.failure_contexts([], 8) == []

    async def test_a_rounds_decisions_are_stored_together_with_what_they_settle(
        self, stores: tuple[Any, Any]
    ) -> None:
        """`record_decisions`: each decision as `record_decision` stores it, and a plan
        settles its job's escalation of its time or older (only an escalation)."""
        state, pins = stores
        await state.attend("job-a", "escalated", "restart_loop", at(10))
        await state.attend("job-b", "escalated", "restart_loop", at(99))  # newer: kept
        await state.attend("job-c", "lost", "", at(1))  # not an escalation: kept
        pinned = [Pin("c-300", "restored from", "p1", 300, 2)]
        writes = [
            DecisionWrite(
                "job-a",
                1,
                DecisionRecord(events=('{"a":1}',)),
                plan=plan("p1"),
                pins=pinned,
                planned_at=at(900),
                settles=at(10),
            ),
            DecisionWrite(
                "job-b",
                1,
                DecisionRecord(events=('{"b":1}',)),
                plan("p2", "job-b"),
                (),
                None,
                at(50),
            ),
            DecisionWrite("job-c", 3, DecisionRecord(events=('{"c":1}',)), settles=at(50)),
        ]
        await state.record_decisions(writes)
        await state.record_decisions([])
        assert await state.decisions_of(
            [("job-a", 1), ("job-b", 1), ("job-c", 3), ("job-c", 1)]
        ) == [w.decision for w in writes] + [None]
        assert await state.plans_of(["p1", "p2"]) == {"p1": plan("p1"), "p2": plan("p2", "job-b")}
        assert await pins.pins("job-a") == pinned
        assert list((await state.history("job-a", 1, 4)).restarts) == [at(900)]
        assert list((await state.history("job-b", 1, 4)).restarts) == [at(1000)]
        assert [(a.job_id, a.status) for a in await state.attention()] == [
            ("job-b", "escalated"),
            ("job-c", "lost"),
        ]
        await state.mark_published_many([("job-a", 1, writes[0].decision)])
        assert await state.decision("job-a", 1) == DecisionRecord(
            events=('{"a":1}',), published=True
        )

    async def test_leases_holds_and_points_are_read_many_at_once(
        self, stores: tuple[Any, Any]
    ) -> None:
        state, _ = stores
        assert await state.lease("job-a", 1, "other", 30.0) is True
        decided = DecisionRecord(events=('{"b":1}',))
        await state.record_decision("job-b", 1, decided)
        got = await state.lease_many([("job-a", 1), ("job-b", 1), ("job-a", 2)], "me", 30.0)
        assert got == [(False, None), (True, decided), (True, None)]  # a decision: if taken
        assert await state.lease_many([("job-b", 1)], "again", 30.0) == [(False, None)]
        await state.release_many([("job-a", 1), ("job-b", 1)])
        assert await state.lease_many([("job-a", 1), ("job-b", 1)], "me", 30.0) == [
            (True, None),
            (True, decided),
        ]
        await state.set_held("job-b", True)
        assert await state.held_of(["job-a", "job-b"]) == {"job-b"}
        assert await state.held_of([]) == set()
        await state.record_progress("job-a", [point(3), point(4)], last=point(4))
        assert await state.points_at([("job-a", 4), ("job-a", 9), ("job-b", 3)]) == [
            point(4),
            None,
            None,
        ]
