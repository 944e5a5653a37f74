"""In-memory coordinator state: the fake of `ckpt_ha.restore_coordinator.store.RedisRestores` (same
contract suite, ``tests/support/restores_contract.py``). No expiry of idle state; leases expire
on the monotonic clock like Redis's ``PX``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ckpt_ha.core.pins import Pin
from ckpt_ha.restore_coordinator.records import (
    Attention,
    DecisionRecord,
    DecisionWrite,
    Failure,
    FailureContext,
    FailureItem,
    History,
    PlanRecord,
    Point,
    Started,
    Watch,
)
from tests.support.fakes.pins import InMemoryPins


@dataclass
class _Job:
    trajectory: dict[int, Point] = field(default_factory=dict)
    failures: dict[int, Failure] = field(default_factory=dict)
    restarts: dict[str, datetime] = field(default_factory=dict)
    storage: dict[str, datetime] = field(default_factory=dict)
    excluded: set[str] = field(default_factory=set)


def _by_time(entries: dict[str, datetime]) -> list[datetime]:
    return [at for _, at in sorted(entries.items(), key=lambda kv: (kv[1], kv[0]))]


class InMemoryRestores:
    def __init__(
        self,
        pins: InMemoryPins | None = None,
        *,
        trajectory_limit: int = 10_000,
        history_limit: int = 200,
    ) -> None:
        self.pin_store = pins if pins is not None else InMemoryPins()
        self.trajectory_limit = trajectory_limit
        self.history_limit = history_limit
        self.jobs: dict[str, _Job] = {}
        self.starts: dict[tuple[str, int], Started] = {}
        self.lasts: dict[tuple[str, int], Point] = {}
        self.decisions: dict[tuple[str, int], DecisionRecord] = {}
        self.leases: dict[tuple[str, int], tuple[str, float]] = {}
        self.plans: dict[str, PlanRecord] = {}
        self.observed: dict[str, list[Point]] = {}
        self.verdicts: dict[str, str] = {}
        self.ended: dict[str, int] = {}
        self.watches: dict[str, Watch] = {}
        self.heard_at: dict[str, datetime] = {}
        self.holds: set[str] = set()
        self.attentions: dict[str, Attention] = {}

    def _job(self, job: str) -> _Job:
        return self.jobs.setdefault(job, _Job())

    async def record_started(self, job: str, started: Started) -> None:
        self.starts[(job, started.attempt)] = started

    async def started(self, job: str, attempt: int) -> Started | None:
        return self.starts.get((job, attempt))

    async def end_run(self, job: str, last_attempt: int) -> None:
        """Nothing expires here; the end is noted (what a test can check)."""
        self.ended[job] = last_attempt

    async def record_progress(
        self, job: str, points: Sequence[Point], *, last: Point | None = None
    ) -> None:
        if last is not None:
            self.lasts[(job, last.attempt)] = last
        if not points:
            return
        traj = self._job(job).trajectory
        traj.update({p.step: p for p in points})
        for step in sorted(traj)[: max(0, len(traj) - self.trajectory_limit)]:
            del traj[step]

    async def record_progress_many(self, points: Mapping[str, Sequence[Point]]) -> None:
        for job, pts in points.items():
            for p in pts:
                await self.record_progress(job, [p], last=p)

    async def point_at(self, job: str, step: int) -> Point | None:
        return self._job(job).trajectory.get(step)

    async def last(self, job: str, attempt: int) -> Point | None:
        return self.lasts.get((job, attempt))

    async def trajectory(self, job: str, steps: Iterable[int]) -> dict[int, Point]:
        traj = self._job(job).trajectory
        out = {s: traj[s] for s in set(steps) if s in traj}
        if traj:
            top = max(traj)
            out[top] = traj[top]
        return out

    async def observe(self, plan: str, point: Point, keep: int) -> list[Point]:
        kept = self.observed.setdefault(plan, [])
        kept.append(point)
        del kept[keep:]
        return list(kept)

    async def set_verdict(self, plan: str, verdict: str) -> bool:
        if plan in self.verdicts:
            return False
        self.verdicts[plan] = verdict
        return True

    async def verdict(self, plan: str) -> str | None:
        return self.verdicts.get(plan)

    async def failure_context(
        self, job: str, attempt: int, failure: Failure, storage_key: str | None, same_window: int
    ) -> tuple[Started | None, Point | None, History, set[str], DecisionRecord | None]:
        state = self._job(job)
        state.failures[attempt] = failure
        state.failures.pop(attempt - self.history_limit, None)
        if storage_key is not None:
            state.storage[storage_key] = failure.at
        return (
            self.starts.get((job, attempt)),
            self.lasts.get((job, attempt)),
            await self.history(job, attempt, same_window),
            set(state.excluded),
            self.decisions.get((job, attempt)),
        )

    async def failure_contexts(
        self, failures: Sequence[FailureItem], same_window: int
    ) -> list[FailureContext]:
        return [await self.failure_context(*f, same_window) for f in failures]

    async def held_of(self, jobs: Sequence[str]) -> set[str]:
        return {j for j in jobs if j in self.holds}

    async def points_at(self, wanted: Sequence[tuple[str, int]]) -> list[Point | None]:
        return [await self.point_at(job, step) for job, step in wanted]

    async def failures(self, job: str) -> list[Failure]:
        return [f for _, f in sorted(self._job(job).failures.items())]

    async def set_held(self, job: str, held: bool) -> None:
        if held:
            self.holds.add(job)
        else:
            self.holds.discard(job)

    async def held(self, job: str) -> bool:
        return job in self.holds

    async def attend(self, job: str, status: str, reason: str, at: datetime) -> None:
        old = self.attentions.get(job)
        if old is None or old.since <= at:
            self.attentions[job] = Attention(job_id=job, status=status, reason=reason, since=at)

    async def settle(self, job: str, at: datetime, only: str = "") -> None:
        old = self.attentions.get(job)
        if old is not None and old.since <= at and only in ("", old.status):
            del self.attentions[job]

    async def attention(self) -> list[Attention]:
        return [self.attentions[j] for j in sorted(self.attentions)]

    async def record_storage_error(self, job: str, key: str, at: datetime) -> None:
        self._job(job).storage[key] = at

    async def history(self, job: str, attempt: int, same_window: int) -> History:
        state = self._job(job)
        first = max(1, attempt - same_window + 1)
        return History(
            restarts=_by_time(state.restarts),
            failures=[state.failures[a] for a in range(first, attempt + 1) if a in state.failures],
            storage_errors=_by_time(state.storage),
        )

    async def exclude(self, job: str, checkpoint_id: str) -> set[str]:
        state = self._job(job)
        state.excluded.add(checkpoint_id)
        return set(state.excluded)

    async def excluded(self, job: str) -> set[str]:
        return set(self._job(job).excluded)

    async def decision(self, job: str, attempt: int) -> DecisionRecord | None:
        return self.decisions.get((job, attempt))

    async def lease(self, job: str, attempt: int, owner: str, ttl_s: float) -> bool:
        now = time.monotonic()
        held = self.leases.get((job, attempt))
        if held is not None and held[1] > now:
            return False
        self.leases[(job, attempt)] = (owner, now + max(0.001, ttl_s))
        return True

    async def release(self, job: str, attempt: int) -> None:
        self.leases.pop((job, attempt), None)

    async def lease_many(
        self, failures: Sequence[tuple[str, int]], owner: str, ttl_s: float
    ) -> list[tuple[bool, DecisionRecord | None]]:
        out: list[tuple[bool, DecisionRecord | None]] = []
        for job, attempt in failures:
            taken = await self.lease(job, attempt, owner, ttl_s)
            out.append((taken, self.decisions.get((job, attempt)) if taken else None))
        return out

    async def release_many(self, failures: Sequence[tuple[str, int]]) -> None:
        for job, attempt in failures:
            await self.release(job, attempt)

    async def decisions_of(
        self, failures: Sequence[tuple[str, int]]
    ) -> list[DecisionRecord | None]:
        return [self.decisions.get(f) for f in failures]

    async def record_decisions(self, writes: Sequence[DecisionWrite]) -> None:
        for w in writes:
            if w.settles is not None:
                await self.settle(w.job, w.settles, only="escalated")
            await self.record_decision(
                w.job, w.attempt, w.decision, plan=w.plan, pins=w.pins, planned_at=w.planned_at
            )

    async def mark_published_many(
        self, decisions: Sequence[tuple[str, int, DecisionRecord]]
    ) -> None:
        for job, attempt, decision in decisions:
            await self.mark_published(job, attempt, decision)

    async def record_decision(
        self,
        job: str,
        attempt: int,
        decision: DecisionRecord,
        *,
        plan: PlanRecord | None = None,
        pins: Sequence[Pin] = (),
        planned_at: datetime | None = None,
    ) -> None:
        self.decisions[(job, attempt)] = decision
        if plan is not None:
            self.plans[plan.plan_id] = plan
            restarts = self._job(job).restarts
            restarts[plan.plan_id] = planned_at or plan.failed_at
            ordered = sorted(restarts.items(), key=lambda kv: (kv[1], kv[0]))
            for plan_id, _ in ordered[: max(0, len(ordered) - self.history_limit)]:
                del restarts[plan_id]
        self.pin_store.stage(job, pins)

    async def recent_restarts(self, since: datetime) -> dict[str, int]:
        counts = {
            job: sum(1 for at in state.restarts.values() if at >= since)
            for job, state in self.jobs.items()
            if job not in self.holds
        }
        return {job: n for job, n in sorted(counts.items()) if n}

    async def mark_published(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        self.decisions[(job, attempt)] = decision.model_copy(update={"published": True})

    async def plan(self, plan_id: str) -> PlanRecord | None:
        return self.plans.get(plan_id)

    async def plans_of(self, plan_ids: Sequence[str]) -> dict[str, PlanRecord]:
        return {i: self.plans[i] for i in plan_ids if i in self.plans}

    async def verdicts_of(self, plan_ids: Sequence[str]) -> dict[str, str]:
        return {i: self.verdicts[i] for i in plan_ids if i in self.verdicts}

    async def update_watch(
        self, job: str, change: Callable[[Watch | None], Watch | None]
    ) -> Watch | None:
        old = self.watches.get(job)
        new = change(old)
        if new is not None:
            self.watches[job] = new
            for member in new.unheard(old):
                self.heard_at.pop(member, None)
        return new

    async def update_watches(
        self, changes: Mapping[str, Callable[[Watch | None], Watch | None]]
    ) -> dict[str, Watch | None]:
        return {job: await self.update_watch(job, change) for job, change in changes.items()}

    async def heard(self, attempt: str, at: datetime) -> None:
        if attempt not in self.heard_at or self.heard_at[attempt] < at:
            self.heard_at[attempt] = at

    async def heard_many(self, attempts: Mapping[str, datetime]) -> None:
        for attempt, at in attempts.items():
            await self.heard(attempt, at)

    async def last_heard(self, attempts: Sequence[str]) -> dict[str, datetime]:
        return {a: self.heard_at[a] for a in attempts if a in self.heard_at}

    async def watch(self, job: str) -> Watch | None:
        return self.watches.get(job)

    async def overdue(self, now: datetime, limit: int) -> list[Watch]:
        due = [(w.due, j) for j, w in self.watches.items() if w.due is not None and w.due < now]
        return [self.watches[j] for _, j in sorted(due)[:limit]]
