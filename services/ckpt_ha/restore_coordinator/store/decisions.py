"""The coordinator's store, its decision side: failures, the job's history (restarts,
storage errors), exclusions, the lease on a failure, and the decision stored with the plan and
pins it implies in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ckpt_ha.core.pins import Pin
from ckpt_ha.registry import leases
from ckpt_ha.restore_coordinator.records import (
    DecisionRecord,
    Failure,
    History,
    PlanRecord,
    Point,
    Started,
    failure_json,
    failure_of,
    from_unix,
    point_of,
    text,
    unix,
)
from ckpt_ha.restore_coordinator.store.base import StoreBase


class DecisionStore(StoreBase):
    """job.failed / resume.load_failed and the operator's acts (see
    `ckpt_ha.restore_coordinator.store`)."""

    async def failure_context(
        self, job: str, attempt: int, failure: Failure, storage_key: str | None, same_window: int
    ) -> tuple[Started | None, Point | None, History, set[str], DecisionRecord | None]:
        """Record the failure (idempotent) and read everything a decision needs in one round
        trip: the attempt's start, its last progress, the job's history, its exclusions, and a
        decision already taken for this failure."""
        failures = self._k("failures", job)
        restarts, storage = self._k("restarts", job), self._k("storage", job)
        first = max(1, attempt - same_window + 1)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hset(failures, str(attempt), failure_json(failure))
            pipe.hdel(failures, str(attempt - self.history_limit))
            self._expire(pipe, failures)
            if storage_key is not None:
                pipe.zadd(storage, {storage_key: unix(failure.at)})
                self._expire(pipe, storage)
            pipe.get(self._k("started", job, attempt))
            pipe.get(self._k("last", job, attempt))
            pipe.hmget(failures, [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(restarts, 0, -1, withscores=True)
            pipe.zrange(storage, 0, -1, withscores=True)
            pipe.smembers(self._k("excluded", job))
            pipe.get(self._k("decision", job, attempt))
            out = await pipe.execute()
        started_raw, last_raw, fails, rs, ss, excluded, decision_raw = out[-7:]
        history = History(
            restarts=[from_unix(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[from_unix(s) for _, s in ss],
        )
        return (
            Started.model_validate_json(started_raw) if started_raw else None,
            point_of(last_raw) if last_raw else None,
            history,
            {text(x) for x in excluded},
            DecisionRecord.model_validate_json(decision_raw) if decision_raw else None,
        )

    async def set_held(self, job: str, held: bool) -> None:
        """``<p>:coord:held:<job>``: automatic restores paused (no expiry: until unheld)."""
        k = self._k("held", job)
        if not held:
            await self._r.delete(k)
            return
        if self._replay is not None:
            self._replay.persist(k)
        await self._r.set(k, "1")

    async def record_storage_error(self, job: str, key: str, at: datetime) -> None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.zadd(self._k("storage", job), {key: unix(at)})
            self._expire(pipe, self._k("storage", job))
            await pipe.execute()

    async def history(self, job: str, attempt: int, same_window: int) -> History:
        first = max(1, attempt - same_window + 1)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(self._k("failures", job), [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(self._k("restarts", job), 0, -1, withscores=True)
            pipe.zrange(self._k("storage", job), 0, -1, withscores=True)
            fails, rs, ss = await pipe.execute()
        return History(
            restarts=[from_unix(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[from_unix(s) for _, s in ss],
        )

    async def exclude(self, job: str, checkpoint_id: str) -> set[str]:
        """Never restore from this again (a checkpoint id, or one location of it:
        `domain.exclusion`); returns every exclusion so far."""
        k = self._k("excluded", job)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.sadd(k, checkpoint_id)
            self._expire(pipe, k)
            pipe.smembers(k)
            members = (await pipe.execute())[-1]
        return {text(x) for x in members}

    async def excluded(self, job: str) -> set[str]:
        return {text(x) for x in await self._r.smembers(self._k("excluded", job))}

    async def lease(self, job: str, attempt: int, owner: str, ttl_s: float) -> bool:
        """Take the right to decide this failure (two replicas, or a duplicate event)."""
        return await leases.acquire(self._r, self._k("lease", job, attempt), owner, ttl_s)

    async def release(self, job: str, attempt: int) -> None:
        await self._r.delete(self._k("lease", job, attempt))

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
        """Store the decision and what it implies (plan, restart, pins) in one transaction."""
        async with self._r.pipeline(transaction=True) as pipe:
            k = self._k("decision", job, attempt)
            pipe.set(k, decision.model_dump_json(), ex=self._ttl(k))
            if plan is not None:
                k = self._k("plan", plan.plan_id)
                pipe.set(k, plan.model_dump_json(), ex=self._ttl(k))
                restarts = self._k("restarts", job)
                pipe.zadd(restarts, {plan.plan_id: unix(planned_at or plan.failed_at)})
                pipe.zremrangebyrank(restarts, 0, -self.history_limit - 1)
                self._expire(pipe, restarts)
                # The index of jobs by their latest restart (what `recent_restarts` reads):
                # no expiry, trimmed to the stores' lifetime as it is written.
                at = unix(planned_at or plan.failed_at)
                pipe.zadd(self._k("restarted"), {job: at}, gt=True)
                pipe.zremrangebyscore(self._k("restarted"), "-inf", at - self.ttl_s)
            self._pins.stage(pipe, job, pins)
            await pipe.execute()

    async def recent_restarts(self, since: datetime) -> dict[str, int]:
        """Restarts planned at or after ``since``, per job that has any and is not held: the
        stored decisions (every replica reads the same; a replica's restart loses none)."""
        low = unix(since)
        jobs = [text(j) for j in await self._r.zrangebyscore(self._k("restarted"), low, "+inf")]
        if not jobs:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for job in jobs:
                pipe.zrangebyscore(self._k("restarts", job), low, "+inf")
                pipe.get(self._k("held", job))
            found = await pipe.execute()
        return {
            job: len(plans)
            for job, plans, held in zip(jobs, found[::2], found[1::2], strict=True)
            if plans and held is None
        }

    async def mark_published(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        done = decision.model_copy(update={"published": True})
        k = self._k("decision", job, attempt)
        await self._r.set(k, done.model_dump_json(), ex=self._ttl(k))
