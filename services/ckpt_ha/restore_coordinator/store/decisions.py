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
    COMPACT_JSON,
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
        """`failure_context` of many failures (a burst), in their order: one script call
        (`lua/failures.lua`)."""
        if not failures:
            return []
        keys: list[str] = []
        docs: list[list[object]] = []
        for job, attempt, failure, storage_key in failures:
            recorded, storage = self._k("failures", job), self._k("storage", job)
            keys += (
                recorded,
                storage,
                self._k("started", job, attempt),
                self._k("last", job, attempt),
                self._k("restarts", job),
                self._k("excluded", job),
                self._k("decision", job, attempt),
            )
            first = max(1, attempt - same_window + 1)
            docs.append(
                [
                    str(attempt),
                    failure_json(failure),
                    str(attempt - self.history_limit),
                    storage_key or "",
                    repr(unix(failure.at)),
                    [str(a) for a in range(first, attempt + 1)],
                ]
            )
            if self._replay is not None:
                self._replay.touch(recorded, self.ttl_s)
                if storage_key is not None:
                    self._replay.touch(storage, self.ttl_s)
        ttl = self.ttl_s if self._replay is None else 0
        out = await self._failures_script(keys=keys, args=[ttl, COMPACT_JSON.encode(docs)])
        return [_context_of(_scored(found)) for found in out]

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

    async def lease_many(
        self, failures: Sequence[tuple[str, int]], owner: str, ttl_s: float
    ) -> list[tuple[bool, DecisionRecord | None]]:
        """`lease` of many failures in one script call (`lua/leases.lua`): for each, whether
        it was taken and, if so, the decision stored for it (read under the lease)."""
        if not failures:
            return []
        found = await self._leases_script(
            keys=[
                *(self._k("lease", job, attempt) for job, attempt in failures),
                *(self._k("decision", job, attempt) for job, attempt in failures),
            ],
            args=[owner, leases.ms(ttl_s)],
        )
        taken = [bool(t) for t in found[::2]]
        try:
            stored = [DecisionRecord.model_validate_json(r) if r else None for r in found[1::2]]
        except ValueError:  # a stored decision unreadable: the leases go back, as they would
            await self.release_many([f for f, t in zip(failures, taken, strict=True) if t])
            raise
        return list(zip(taken, stored, strict=True))

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
        """`record_decision` of many failures (a burst) in one script call, all or nothing
        (`lua/decisions.lua`), each after settling the escalation its plan ends
        (`DecisionWrite.settles`)."""
        if not writes:
            return
        if self._replay is not None:  # (a replay stores one decision at a time)
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
            return
        keys = [self._k("attention"), self._k("restarted")]
        docs: list[list[object]] = []
        for w in writes:
            pins_key, pins = self._pins.for_script(w.job, w.pins)
            keys += (self._k("decision", w.job, w.attempt), self._k("restarts", w.job), pins_key)
            plan, member, score = "", "", ""
            if w.plan is not None:
                keys.append(self._k("plan", w.plan.plan_id))
                plan, member = w.plan.model_dump_json(), w.plan.plan_id
                score = repr(unix(w.planned_at or w.plan.failed_at))
            settles = repr(unix(w.settles)) if w.settles is not None else ""
            docs.append([w.job, settles, w.decision.model_dump_json(), plan, member, score, pins])
        await self._decisions_script(
            keys=keys, args=[self.ttl_s, self.history_limit, COMPACT_JSON.encode(docs)]
        )

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
            self._stage_decision(
                pipe, DecisionWrite(job, attempt, decision, plan, pins, planned_at)
            )
            await pipe.execute()

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
            # The index of jobs by their latest restart (what `recent_restarts` reads):
            # no expiry, trimmed to the stores' lifetime as it is written.
            at = unix(w.planned_at or w.plan.failed_at)
            pipe.zadd(self._k("restarted"), {w.job: at}, gt=True)
            pipe.zremrangebyscore(self._k("restarted"), "-inf", at - self.ttl_s)
        self._pins.stage(pipe, w.job, w.pins)

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

    async def mark_published_many(
        self, decisions: Sequence[tuple[str, int, DecisionRecord]]
    ) -> None:
        """`mark_published` of many decisions in one script call (`lua/published.lua`)."""
        if not decisions:
            return
        docs = [d.model_copy(update={"published": True}).model_dump_json() for _, _, d in decisions]
        keys = [self._k("decision", job, attempt) for job, attempt, _ in decisions]
        if self._replay is not None:  # (a replay marks nothing published: never here)
            for k, doc in zip(keys, docs, strict=True):
                await self._r.set(k, doc, ex=self._ttl(k))
            return
        await self._published_script(keys=keys, args=[self.ttl_s, *docs])


def _scored(found: list[Any]) -> list[Any]:
    """A script's context (`lua/failures.lua`) as the pipeline's: sorted sets as (member,
    score) pairs."""
    started, last, fails, restarts, storage, excluded, decision = found
    return [started, last, fails, _pairs(restarts), _pairs(storage), excluded, decision]


def _pairs(flat: list[Any]) -> list[tuple[Any, float]]:
    return [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]


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
