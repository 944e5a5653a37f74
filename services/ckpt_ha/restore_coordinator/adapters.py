"""The coordinator's memory in Redis, and its reads of the registry.

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
* ``<p>:coord:decision:<job>:<attempt>`` JSON: the events decided for that failed attempt
  (plan or escalation) and whether they were published; one decision per failure
* ``<p>:coord:lease:<job>:<attempt>``    SET NX EX: who is deciding that failure right now
* ``<p>:coord:plan:<plan>``              JSON `PlanRecord` (what the plan restored, for whom)
* ``<p>:coord:obs:<plan>``               list of the resumed attempt's first progress points
* ``<p>:coord:verdict:<plan>``           ``verified`` / ``diverged`` (SET NX: one verdict)
* ``<p>:pins:<job>``                     hash checkpoint id → JSON pin (R15; retention reads it)

Everything but pins expires after ``ttl_s`` of inactivity on the key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from pydantic import AwareDatetime, BaseModel, ConfigDict
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ckpt_ha.contracts.checkpoint import RuntimeEnvironment, Topology
from ckpt_ha.contracts.job import JobPolicy, JobStartedV1
from ckpt_ha.registry.redis_registry import CheckpointRecord, RegistryUnavailable
from ckpt_ha.restore_coordinator.domain import (
    Candidate,
    Failure,
    History,
    Pin,
    Point,
    Selection,
    Target,
    select,
)

CHUNK = 8
"""Registry records read per round trip while looking for the newest valid checkpoints."""


class Started(BaseModel):
    """What an attempt's ``job.started`` declared."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    attempt: int
    at: AwareDatetime
    policy: JobPolicy = JobPolicy()
    environment: RuntimeEnvironment | None = None
    topology: Topology | None = None
    code_version: str | None = None
    plan_id: str | None = None

    @classmethod
    def of(cls, data: JobStartedV1, at: datetime) -> Started:
        return cls(
            run_id=data.run_id,
            attempt=data.attempt,
            at=at,
            policy=data.policy or JobPolicy(),
            environment=data.environment,
            topology=data.topology,
            code_version=data.code_version,
            plan_id=data.plan_id,
        )

    def target(self) -> Target:
        return Target(self.environment, self.topology, self.code_version)


class PlanRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_id: str
    job_id: str
    failed_run_id: str
    failed_attempt: int
    attempt: int
    checkpoint_id: str
    step: int
    fallbacks: int = 0
    failed_at: AwareDatetime
    policy: JobPolicy = JobPolicy()


class Decision(BaseModel):
    """The events decided for one failure, stored before they are published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    events: tuple[str, ...]
    """Envelope JSON, published in order (re-published as is after a crash: same ids)."""
    published: bool = False


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


def pin_json(p: Pin) -> str:
    return json.dumps(asdict(p), separators=(",", ":"))


def pin_of(raw: str | bytes) -> Pin:
    return Pin(**json.loads(raw))


def candidate(r: CheckpointRecord) -> Candidate:
    return Candidate(
        checkpoint_id=r.checkpoint_id,
        step=r.step,
        uri=r.uri,
        state=r.state,
        identity=r.identity,
        created_at=r.created_at,
        exact_resume=r.exact_resume,
        format=r.format.value,
        run_id=r.run_id,
        traceparent=r.traceparent,
        tracestate=r.tracestate,
    )


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ts(at: datetime) -> float:
    return at.timestamp()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class CoordinatorState:
    """Async Redis adapter for the coordinator's per-job state (see the module doc)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        *,
        trajectory_limit: int = 10_000,
        history_limit: int = 200,
        ttl_s: int = 30 * 24 * 3600,
    ) -> None:
        self.r = client
        self.p = prefix
        self.trajectory_limit = trajectory_limit
        self.history_limit = history_limit
        self.ttl_s = ttl_s

    @classmethod
    def from_url(cls, url: str, prefix: str, **kwargs: Any) -> CoordinatorState:
        return cls(aioredis.Redis.from_url(url, decode_responses=True), prefix, **kwargs)

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except (RedisConnectionError, RedisTimeoutError, OSError):
            return False

    def k(self, *parts: str | int) -> str:
        return ":".join((self.p, "coord", *(str(x) for x in parts)))

    def pins_key(self, job: str) -> str:
        return f"{self.p}:pins:{job}"

    # --- job.started / job.progress ---

    async def record_started(self, job: str, started: Started) -> None:
        await self.r.set(self.k("started", job, started.attempt), started.model_dump_json(),
                         ex=self.ttl_s)  # fmt: skip

    async def started(self, job: str, attempt: int) -> Started | None:
        raw = await self.r.get(self.k("started", job, attempt))
        return Started.model_validate_json(raw) if raw else None

    async def record_progress(
        self, job: str, points: Sequence[Point], *, last: Point | None = None
    ) -> None:
        """``points`` into the trajectory (bounded: the oldest steps go first); ``last`` as its
        attempt's last progress (for the recompute range)."""
        traj, idx = self.k("traj", job), self.k("trajidx", job)
        async with self.r.pipeline(transaction=False) as pipe:
            if last is not None:
                pipe.set(self.k("last", job, last.attempt), point_json(last), ex=self.ttl_s)
            if points:
                pipe.hset(traj, mapping={str(p.step): point_json(p) for p in points})
                pipe.zadd(idx, {str(p.step): p.step for p in points})
                pipe.expire(traj, self.ttl_s)
                pipe.expire(idx, self.ttl_s)
                pipe.zcard(idx)
            result = await pipe.execute()
        size = int(result[-1]) if points else 0
        if size > self.trajectory_limit:
            dropped = await self.r.zpopmin(idx, size - self.trajectory_limit)
            if dropped:
                await self.r.hdel(traj, *[_str(pair[0]) for pair in dropped])

    async def point_at(self, job: str, step: int) -> Point | None:
        raw = await self.r.hget(self.k("traj", job), str(step))
        return point_of(raw) if raw else None

    async def last(self, job: str, attempt: int) -> Point | None:
        raw = await self.r.get(self.k("last", job, attempt))
        return point_of(raw) if raw else None

    async def trajectory(self, job: str, steps: Iterable[int]) -> dict[int, Point]:
        """The trajectory's points at these steps, plus its highest step (so a caller knows
        where the pre-failure trajectory ends)."""
        wanted = [str(s) for s in sorted(set(steps))] or ["-1"]
        traj, idx = self.k("traj", job), self.k("trajidx", job)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hmget(traj, wanted)
            pipe.zrevrange(idx, 0, 0, withscores=True)
            found, top = await pipe.execute()
        out = {int(s): point_of(raw) for s, raw in zip(wanted, found, strict=True) if raw}
        if top:
            last_step = int(top[0][1])
            if last_step not in out:
                raw = await self.r.hget(traj, str(last_step))
                if raw:
                    out[last_step] = point_of(raw)
        return out

    async def observe(self, plan: str, point: Point, keep: int) -> list[Point]:
        """Append one of the resumed attempt's reports; return all kept so far (arrival order)."""
        key = self.k("obs", plan)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.rpush(key, point_json(point))
            pipe.ltrim(key, 0, keep - 1)
            pipe.lrange(key, 0, -1)
            pipe.expire(key, self.ttl_s)
            _, _, raws, _ = await pipe.execute()
        return [point_of(r) for r in raws]

    async def set_verdict(self, plan: str, verdict: str) -> bool:
        return bool(await self.r.set(self.k("verdict", plan), verdict, nx=True, ex=self.ttl_s))

    async def verdict(self, plan: str) -> str | None:
        value = await self.r.get(self.k("verdict", plan))
        return str(value) if value else None

    # --- failures, decisions, plans ---

    async def failure_context(
        self, job: str, attempt: int, failure: Failure, storage_key: str | None, same_window: int
    ) -> tuple[Started | None, Point | None, History, set[str], Decision | None]:
        """Record the failure (idempotent) and read everything a decision needs in one round
        trip: the attempt's start, its last progress, the job's history, its exclusions, and a
        decision already taken for this failure."""
        failures = self.k("failures", job)
        restarts, storage = self.k("restarts", job), self.k("storage", job)
        first = max(1, attempt - same_window + 1)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hset(failures, str(attempt), failure_json(failure))
            pipe.hdel(failures, str(attempt - self.history_limit))
            pipe.expire(failures, self.ttl_s)
            if storage_key is not None:
                pipe.zadd(storage, {storage_key: _ts(failure.at)})
                pipe.expire(storage, self.ttl_s)
            pipe.get(self.k("started", job, attempt))
            pipe.get(self.k("last", job, attempt))
            pipe.hmget(failures, [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(restarts, 0, -1, withscores=True)
            pipe.zrange(storage, 0, -1, withscores=True)
            pipe.smembers(self.k("excluded", job))
            pipe.get(self.k("decision", job, attempt))
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
            set(excluded),
            Decision.model_validate_json(decision_raw) if decision_raw else None,
        )

    async def record_storage_error(self, job: str, key: str, at: datetime) -> None:
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.zadd(self.k("storage", job), {key: _ts(at)})
            pipe.expire(self.k("storage", job), self.ttl_s)
            await pipe.execute()

    async def history(self, job: str, attempt: int, same_window: int) -> History:
        first = max(1, attempt - same_window + 1)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hmget(self.k("failures", job), [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(self.k("restarts", job), 0, -1, withscores=True)
            pipe.zrange(self.k("storage", job), 0, -1, withscores=True)
            fails, rs, ss = await pipe.execute()
        return History(
            restarts=[_dt(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[_dt(s) for _, s in ss],
        )

    async def exclude(self, job: str, checkpoint_id: str) -> set[str]:
        key = self.k("excluded", job)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.sadd(key, checkpoint_id)
            pipe.expire(key, self.ttl_s)
            pipe.smembers(key)
            _, _, members = await pipe.execute()
        return set(members)

    async def decision(self, job: str, attempt: int) -> Decision | None:
        raw = await self.r.get(self.k("decision", job, attempt))
        return Decision.model_validate_json(raw) if raw else None

    async def lease(self, job: str, attempt: int, owner: str, ttl_s: float) -> bool:
        """Take the right to decide this failure (two replicas, or a duplicate event)."""
        key = self.k("lease", job, attempt)
        return bool(await self.r.set(key, owner, nx=True, px=max(1, int(ttl_s * 1000))))

    async def release(self, job: str, attempt: int) -> None:
        await self.r.delete(self.k("lease", job, attempt))

    async def record_decision(
        self,
        job: str,
        attempt: int,
        decision: Decision,
        *,
        plan: PlanRecord | None = None,
        pins: Sequence[Pin] = (),
        planned_at: datetime | None = None,
    ) -> None:
        """Store the decision and what it implies (plan, restart, pins) in one transaction."""
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.set(self.k("decision", job, attempt), decision.model_dump_json(), ex=self.ttl_s)
            if plan is not None:
                pipe.set(self.k("plan", plan.plan_id), plan.model_dump_json(), ex=self.ttl_s)
                restarts = self.k("restarts", job)
                pipe.zadd(restarts, {plan.plan_id: _ts(planned_at or plan.failed_at)})
                pipe.zremrangebyrank(restarts, 0, -self.history_limit - 1)
                pipe.expire(restarts, self.ttl_s)
            if pins:
                pipe.hset(self.pins_key(job), mapping={p.checkpoint_id: pin_json(p) for p in pins})
            await pipe.execute()

    async def mark_published(self, job: str, attempt: int, decision: Decision) -> None:
        done = decision.model_copy(update={"published": True})
        await self.r.set(self.k("decision", job, attempt), done.model_dump_json(), ex=self.ttl_s)

    async def plan(self, plan_id: str) -> PlanRecord | None:
        raw = await self.r.get(self.k("plan", plan_id))
        return PlanRecord.model_validate_json(raw) if raw else None

    # --- pins (R15) ---

    async def pins(self, job: str) -> list[Pin]:
        raws = await self.r.hgetall(self.pins_key(job))
        return [pin_of(v) for v in raws.values()]

    async def unpin(self, job: str, ids: Sequence[str]) -> None:
        if ids:
            await self.r.hdel(self.pins_key(job), *ids)


class RegistryReader:
    """The coordinator's reads of the registry (the registrar owns writes): by the registry's
    own key layout, a few records per round trip, newest step first."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.r = client
        self.p = prefix

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        raw = await self.r.get(f"{self.p}:ckpt:{checkpoint_id}")
        return CheckpointRecord.model_validate_json(raw) if raw else None

    async def select(self, job: str, excluded: Iterable[str] = ()) -> Selection:
        """The newest valid checkpoint not excluded, and the valid one before it."""
        skip = set(excluded)
        seen: list[Candidate] = []
        start = 0
        try:
            while True:
                ids = await self.r.zrevrange(f"{self.p}:job:{job}", start, start + CHUNK - 1)
                if not ids:
                    return select(seen, skip)
                raws = await self.r.mget([f"{self.p}:ckpt:{_str(i)}" for i in ids])
                seen.extend(candidate(CheckpointRecord.model_validate_json(r)) for r in raws if r)
                chosen = select(seen, skip)
                if chosen.previous is not None or len(ids) < CHUNK:
                    return chosen
                start += CHUNK
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RegistryUnavailable(str(exc)) from exc

    async def by_job(self, job: str) -> list[Candidate]:
        ids = await self.r.zrevrange(f"{self.p}:job:{job}", 0, -1)
        if not ids:
            return []
        raws = await self.r.mget([f"{self.p}:ckpt:{_str(i)}" for i in ids])
        return [candidate(CheckpointRecord.model_validate_json(r)) for r in raws if r]
