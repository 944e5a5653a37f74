"""The coordinator's store, its decision side: failures, the job's history (restarts,
storage errors), exclusions, the lease on a failure, and the decision stored with the plan and
pins it implies in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from redis.asyncio.client import Pipeline

from ckpt_ha.core.pins import Pin
from ckpt_ha.registry import leases
from ckpt_ha.restore_coordinator.records import (
    DecisionRecord,
    DecisionWrite,
    Failure,
    FailureContext,
    FailureItem,
    History,
    PlanRecord,
    Started,
    failure_json,
    failure_of,
    from_unix,
    point_of,
    text,
    unix,
)
from ckpt_ha.restore_coordinator.store.base import CHUNK, StoreBase


class DecisionStore(StoreBase):
    """job.failed / resume.load_failed and the operator's acts (see
    `ckpt_ha.restore_coordinator.store`)."""

    async def failure_context(
        self, job: str, attempt: int, failure: Failure, storage_key: str | None, same_window: int
    ) -> FailureContext:
        """Record the failure (idempotent) and read everything a decision needs in one round
        trip: the attempt's start, its last progress, the job's history, its exclusions, and a
        decision already taken for this failure."""
        [context] = await self.failure_contexts([(job, attempt, failure, storage_key)], same_window)
        return context

    async def failure_contexts(
        self, failures: Sequence[FailureItem], same_window: int
    ) -> list[FailureContext]:
        """`failure_context` of many failures (a burst), in one round trip, in their order."""
        async with self._r.pipeline(transaction=False) as pipe:
            counts = [self._queue_failure(pipe, *f, same_window) for f in failures]
            out = await pipe.execute()
        contexts: list[FailureContext] = []
        at = 0
        for n in counts:
            at += n
            contexts.append(_context_of(out[at - 7 : at]))
        return contexts

    def _queue_failure(
        self,
        pipe: Pipeline,
        job: str,
        attempt: int,
        failure: Failure,
        storage_key: str | None,
        same_window: int,
    ) -> int:
        """Queue the writes and reads of one `failure_context`; how many commands (the last 7
        are its reads)."""
        failures = self._k("failures", job)
        restarts, storage = self._k("restarts", job), self._k("storage", job)
        first = max(1, attempt - same_window + 1)
        before = len(pipe)
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
        return len(pipe) - before

    async def held_of(self, jobs: Sequence[str]) -> set[str]:
        """Which of these jobs are held, in one round trip."""
        if not jobs:
            return set()
        raws = await self._r.mget([self._k("held", j) for j in jobs])
        return {j for j, raw in zip(jobs, raws, strict=True) if raw is not None}

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
        """Never restore this checkpoint of the job again; returns every exclusion so far."""
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

    async def lease_many(
        self, failures: Sequence[tuple[str, int]], owner: str, ttl_s: float
    ) -> list[bool]:
        """`lease` of many failures in one round trip: which were taken."""
        if not failures:
            return []
        async with self._r.pipeline(transaction=False) as pipe:
            for job, attempt in failures:
                leases.stage_acquire(pipe, self._k("lease", job, attempt), owner, ttl_s)
            return [bool(x) for x in await pipe.execute()]

    async def release(self, job: str, attempt: int) -> None:
        await self._r.delete(self._k("lease", job, attempt))

    async def release_many(self, failures: Sequence[tuple[str, int]]) -> None:
        for i in range(0, len(failures), CHUNK):
            await self._r.delete(*[self._k("lease", j, a) for j, a in failures[i : i + CHUNK]])

    async def decisions_of(
        self, failures: Sequence[tuple[str, int]]
    ) -> list[DecisionRecord | None]:
        """The decisions stored for these failures, in their order, in one round trip."""
        if not failures:
            return []
        raws = await self._r.mget([self._k("decision", j, a) for j, a in failures])
        return [DecisionRecord.model_validate_json(r) if r else None for r in raws]

    async def record_decisions(self, writes: Sequence[DecisionWrite]) -> None:
        """`record_decision` of many failures (a burst) in one transaction, each with the
        escalation its plan settles (`DecisionWrite.settles`)."""
        if not writes:
            return
        async with self._r.pipeline(transaction=True) as pipe:
            for w in writes:
                if w.settles is not None:
                    await self._attention_script(
                        keys=[self._k("attention")],
                        args=[w.job, unix(w.settles), "", "escalated"],
                        client=pipe,
                    )
                self._stage_decision(pipe, w)
            await pipe.execute()

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
        await self.record_decisions([DecisionWrite(job, attempt, decision, plan, pins, planned_at)])

    def _stage_decision(self, pipe: Pipeline, w: DecisionWrite) -> None:
        k = self._k("decision", w.job, w.attempt)
        pipe.set(k, w.decision.model_dump_json(), ex=self._ttl(k))
        if w.plan is not None:
            k = self._k("plan", w.plan.plan_id)
            pipe.set(k, w.plan.model_dump_json(), ex=self._ttl(k))
            restarts = self._k("restarts", w.job)
            pipe.zadd(restarts, {w.plan.plan_id: unix(w.planned_at or w.plan.failed_at)})
            pipe.zremrangebyrank(restarts, 0, -self.history_limit - 1)
            self._expire(pipe, restarts)
        self._pins.stage(pipe, w.job, w.pins)

    async def mark_published(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        done = decision.model_copy(update={"published": True})
        k = self._k("decision", job, attempt)
        await self._r.set(k, done.model_dump_json(), ex=self._ttl(k))

    async def mark_published_many(
        self, decisions: Sequence[tuple[str, int, DecisionRecord]]
    ) -> None:
        """`mark_published` of many decisions in one round trip."""
        if not decisions:
            return
        async with self._r.pipeline(transaction=False) as pipe:
            for job, attempt, decision in decisions:
                done = decision.model_copy(update={"published": True})
                k = self._k("decision", job, attempt)
                pipe.set(k, done.model_dump_json(), ex=self._ttl(k))
            await pipe.execute()


def _context_of(out: list[Any]) -> FailureContext:
    started_raw, last_raw, fails, rs, ss, excluded, decision_raw = out
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
