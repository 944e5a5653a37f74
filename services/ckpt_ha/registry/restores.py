"""The one owner of the restore-coordinator's memory in Redis: ``<p>:coord:*``.

The coordinator writes it (its handlers reach it through their `RestoreState` port); the
retention-janitor and the CLI read it through the typed read API below (`failures`,
`plans_in_progress`, `plan`, `verdict`, `started`). Nothing else formats these keys.

Keys (``<p>`` is the registry prefix; every read per event is a handful of O(1) commands in one
or two round trips, whatever the number of checkpoints in the registry):

* ``<p>:coord:started:<job>:<attempt>``  JSON `Started`: the attempt's policy and restore target
* ``<p>:coord:traj:<job>``               hash step → JSON progress point (pre-failure trajectory)
* ``<p>:coord:trajidx:<job>``            sorted set of the steps in it (bounded: oldest trimmed)
* ``<p>:coord:last:<job>:<attempt>``     JSON last progress point of that attempt
* ``<p>:coord:failures:<job>``           hash attempt → JSON failure (signature, side, time)
* ``<p>:coord:restarts:<job>``           sorted set plan id → time planned (restart loop)
* ``<p>:coord:storage:<job>``            sorted set → time of each infrastructure-side failure
* ``<p>:coord:excluded:<job>``           set of checkpoint ids that failed to load (never again)
* ``<p>:coord:decision:<job>:<attempt>`` JSON `DecisionRecord`: the events decided for that
  failed attempt (plan or escalation) and whether they were published; one per failure
* ``<p>:coord:lease:<job>:<attempt>``    SET NX PX: who is deciding that failure right now
* ``<p>:coord:plan:<plan>``              JSON `PlanRecord` (what the plan restored, for whom)
* ``<p>:coord:obs:<plan>``               list of the resumed attempt's first progress points
* ``<p>:coord:verdict:<plan>``           ``verified`` / ``diverged`` (SET NX: one verdict)

Everything expires after ``ttl_s`` of inactivity on the key. The R15 pins a decision implies
are owned by `ckpt_ha.registry.pins` and written in the decision's transaction through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ckpt_ha.core.restore_records import (
    DecisionRecord,
    Failure,
    History,
    Pin,
    PlanInProgress,
    PlanRecord,
    Point,
    Started,
)
from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.registry.pins import RedisPins

KEY_SPACE = "coord:"
"""Every key of this owner starts with ``<prefix>:`` and this (what a registry rebuild keeps)."""


def key(prefix: str, *parts: str | int) -> str:
    """The key ``<prefix>:coord:<parts joined by ':'>`` (a ``*`` part makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}" + ":".join(str(x) for x in parts)


def point_json(p: Point) -> str:
    doc = asdict(p)
    doc["at"] = p.at.isoformat()
    doc["metrics"] = dict(p.metrics)
    return json.dumps(doc, separators=(",", ":"))


def point_of(raw: str | bytes) -> Point:
    doc = json.loads(raw)
    doc["at"] = datetime.fromisoformat(doc["at"])
    return Point(**doc)


def failure_json(f: Failure) -> str:
    return json.dumps({**asdict(f), "at": f.at.isoformat()}, separators=(",", ":"))


def failure_of(raw: str | bytes) -> Failure:
    doc = json.loads(raw)
    doc["at"] = datetime.fromisoformat(doc["at"])
    return Failure(**doc)


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ts(at: datetime) -> float:
    return at.timestamp()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class RedisRestores:
    """Async Redis adapter for the coordinator's per-job state (see the module doc)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        *,
        pins: RedisPins | None = None,
        trajectory_limit: int = 10_000,
        history_limit: int = 200,
        ttl_s: int = 30 * 24 * 3600,
    ) -> None:
        self._r = client
        self._p = prefix
        self._pins = pins if pins is not None else RedisPins(client, prefix)
        self.trajectory_limit = trajectory_limit
        self.history_limit = history_limit
        self.ttl_s = ttl_s

    @classmethod
    def from_url(cls, where: str | RedisConfig, prefix: str, **kwargs: Any) -> RedisRestores:
        return cls(connect(where), prefix, **kwargs)

    async def close(self) -> None:
        await self._r.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self._r.ping())
        except (RedisConnectionError, RedisTimeoutError, OSError):
            return False

    def _k(self, *parts: str | int) -> str:
        return key(self._p, *parts)

    # --- job.started / job.progress ---

    async def record_started(self, job: str, started: Started) -> None:
        await self._r.set(self._k("started", job, started.attempt), started.model_dump_json(),
                          ex=self.ttl_s)  # fmt: skip

    async def started(self, job: str, attempt: int) -> Started | None:
        raw = await self._r.get(self._k("started", job, attempt))
        return Started.model_validate_json(raw) if raw else None

    async def record_progress(
        self, job: str, points: Sequence[Point], *, last: Point | None = None
    ) -> None:
        """``points`` into the trajectory (bounded: the oldest steps go first); ``last`` as its
        attempt's last progress (for the recompute range)."""
        traj, idx = self._k("traj", job), self._k("trajidx", job)
        async with self._r.pipeline(transaction=False) as pipe:
            if last is not None:
                pipe.set(self._k("last", job, last.attempt), point_json(last), ex=self.ttl_s)
            if points:
                pipe.hset(traj, mapping={str(p.step): point_json(p) for p in points})
                pipe.zadd(idx, {str(p.step): p.step for p in points})
                pipe.expire(traj, self.ttl_s)
                pipe.expire(idx, self.ttl_s)
                pipe.zcard(idx)
            result = await pipe.execute()
        size = int(result[-1]) if points else 0
        if size > self.trajectory_limit:
            dropped = await self._r.zpopmin(idx, size - self.trajectory_limit)
            if dropped:
                await self._r.hdel(traj, *[_str(pair[0]) for pair in dropped])

    async def point_at(self, job: str, step: int) -> Point | None:
        raw = await self._r.hget(self._k("traj", job), str(step))
        return point_of(raw) if raw else None

    async def last(self, job: str, attempt: int) -> Point | None:
        raw = await self._r.get(self._k("last", job, attempt))
        return point_of(raw) if raw else None

    async def trajectory(self, job: str, steps: Iterable[int]) -> dict[int, Point]:
        """The trajectory's points at these steps, plus its highest step (so a caller knows
        where the pre-failure trajectory ends)."""
        wanted = [str(s) for s in sorted(set(steps))] or ["-1"]
        traj, idx = self._k("traj", job), self._k("trajidx", job)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(traj, wanted)
            pipe.zrevrange(idx, 0, 0, withscores=True)
            found, top = await pipe.execute()
        out = {int(s): point_of(raw) for s, raw in zip(wanted, found, strict=True) if raw}
        if top:
            last_step = int(top[0][1])
            if last_step not in out:
                raw = await self._r.hget(traj, str(last_step))
                if raw:
                    out[last_step] = point_of(raw)
        return out

    async def observe(self, plan: str, point: Point, keep: int) -> list[Point]:
        """Append one of the resumed attempt's reports; return all kept so far (arrival order)."""
        key = self._k("obs", plan)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.rpush(key, point_json(point))
            pipe.ltrim(key, 0, keep - 1)
            pipe.lrange(key, 0, -1)
            pipe.expire(key, self.ttl_s)
            _, _, raws, _ = await pipe.execute()
        return [point_of(r) for r in raws]

    async def set_verdict(self, plan: str, verdict: str) -> bool:
        """The first verdict of a plan wins; True if this call set it."""
        return bool(await self._r.set(self._k("verdict", plan), verdict, nx=True, ex=self.ttl_s))

    async def verdict(self, plan: str) -> str | None:
        value = await self._r.get(self._k("verdict", plan))
        return str(value) if value else None

    # --- failures, decisions, plans ---

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
            pipe.expire(failures, self.ttl_s)
            if storage_key is not None:
                pipe.zadd(storage, {storage_key: _ts(failure.at)})
                pipe.expire(storage, self.ttl_s)
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
            restarts=[_dt(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[_dt(s) for _, s in ss],
        )
        return (
            Started.model_validate_json(started_raw) if started_raw else None,
            point_of(last_raw) if last_raw else None,
            history,
            {_str(x) for x in excluded},
            DecisionRecord.model_validate_json(decision_raw) if decision_raw else None,
        )

    async def failures(self, job: str) -> list[Failure]:
        """The job's logged failures, one per attempt (a failure heard twice is one), in
        attempt order: what ``ckpt-ha policy advise`` measures the failure rate from."""
        raws = await self._r.hgetall(self._k("failures", job))
        return sorted((failure_of(v) for v in raws.values()), key=lambda f: f.attempt)

    async def record_storage_error(self, job: str, key: str, at: datetime) -> None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.zadd(self._k("storage", job), {key: _ts(at)})
            pipe.expire(self._k("storage", job), self.ttl_s)
            await pipe.execute()

    async def history(self, job: str, attempt: int, same_window: int) -> History:
        first = max(1, attempt - same_window + 1)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(self._k("failures", job), [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(self._k("restarts", job), 0, -1, withscores=True)
            pipe.zrange(self._k("storage", job), 0, -1, withscores=True)
            fails, rs, ss = await pipe.execute()
        return History(
            restarts=[_dt(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[_dt(s) for _, s in ss],
        )

    async def exclude(self, job: str, checkpoint_id: str) -> set[str]:
        """Never restore this checkpoint of the job again; returns every exclusion so far."""
        key = self._k("excluded", job)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.sadd(key, checkpoint_id)
            pipe.expire(key, self.ttl_s)
            pipe.smembers(key)
            _, _, members = await pipe.execute()
        return {_str(x) for x in members}

    async def excluded(self, job: str) -> set[str]:
        return {_str(x) for x in await self._r.smembers(self._k("excluded", job))}

    async def decision(self, job: str, attempt: int) -> DecisionRecord | None:
        raw = await self._r.get(self._k("decision", job, attempt))
        return DecisionRecord.model_validate_json(raw) if raw else None

    async def lease(self, job: str, attempt: int, owner: str, ttl_s: float) -> bool:
        """Take the right to decide this failure (two replicas, or a duplicate event)."""
        key = self._k("lease", job, attempt)
        return bool(await self._r.set(key, owner, nx=True, px=max(1, int(ttl_s * 1000))))

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
            pipe.set(self._k("decision", job, attempt), decision.model_dump_json(), ex=self.ttl_s)
            if plan is not None:
                pipe.set(self._k("plan", plan.plan_id), plan.model_dump_json(), ex=self.ttl_s)
                restarts = self._k("restarts", job)
                pipe.zadd(restarts, {plan.plan_id: _ts(planned_at or plan.failed_at)})
                pipe.zremrangebyrank(restarts, 0, -self.history_limit - 1)
                pipe.expire(restarts, self.ttl_s)
            self._pins.stage(pipe, job, pins)
            await pipe.execute()

    async def mark_published(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        done = decision.model_copy(update={"published": True})
        await self._r.set(self._k("decision", job, attempt), done.model_dump_json(), ex=self.ttl_s)

    async def plan(self, plan_id: str) -> PlanRecord | None:
        raw = await self._r.get(self._k("plan", plan_id))
        return PlanRecord.model_validate_json(raw) if raw else None

    async def plans_in_progress(self) -> list[PlanInProgress]:
        """Every stored plan without a verdict yet, and whether its resumed attempt started
        (R6: retention keeps what a restore plan or a resume in progress references)."""
        pattern = self._k("plan", "*")
        keys = [_str(k) async for k in self._r.scan_iter(match=pattern, count=500)]
        out: list[PlanInProgress] = []
        for key in sorted(keys):
            plan_id = key.rsplit(":", 1)[1]
            raw, verdict = await self._r.mget(key, self._k("verdict", plan_id))
            if not raw or verdict:
                continue
            plan = PlanRecord.model_validate_json(raw)
            started = await self.started(plan.job_id, plan.attempt)
            resuming = started is not None and started.plan_id == plan.plan_id
            out.append(PlanInProgress(plan, resuming))
        return out
