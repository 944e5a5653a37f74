"""The restore-coordinator's published face: the ONLY module of the coordinator other code
imports (the CLI, the operations, the runner; tests may reach further). What it publishes:

* the name of its Redis key space (`KEY_SPACE`, `key`): ``<p>:coord:*``, every key of it
  formatted by the coordinator (its store, `ckpt_ha.restore_coordinator.store`, and this);
* its read models (`PlanRecord`, `Failure`, `Started`, `Watch`, ...);
* a typed reader of that state (`RestoreReader`: plans, verdicts, failures, starts, holds)
  for the ``ckpt-ha`` commands. Only the coordinator writes it;
* the reader of its job index (`JobIndexReader`): each job's events of the event stream (not
  the checkpoints') and its newest reports, what ``ckpt-ha job list|show`` read instead of the
  whole stream (`ckpt_ha.restore_coordinator.store.job_index` writes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.restore_coordinator.records import (
    DecisionRecord,
    Failure,
    History,
    PlanRecord,
    Point,
    Started,
    Target,
    Watch,
    attempt_key,
    failure_of,
    text,
)

__all__ = [
    "INDEX",
    "INDEX_DURABLE",
    "KEY_SPACE",
    "DecisionRecord",
    "Failure",
    "History",
    "JobIndexReader",
    "PlanRecord",
    "Point",
    "RestoreReader",
    "Started",
    "Target",
    "Watch",
    "attempt_key",
    "key",
]

KEY_SPACE = "coord:"
"""Every key of the coordinator starts with ``<prefix>:`` and this."""
INDEX = "jobs"
"""The job index's keys: ``<p>:coord:jobs:…`` (`JobIndexReader`)."""
INDEX_DURABLE = "restore-coordinator--job-index"
"""The durable on the event stream that keeps the job index: a reader that must see every
event published before it asks waits until this one has acknowledged them."""


def key(prefix: str, *parts: str | int) -> str:
    """The key ``<prefix>:coord:<parts joined by ':'>`` (a ``*`` part makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}" + ":".join(map(str, parts))


class RestoreReader:
    """Typed reads of the coordinator's state in Redis (what ``ckpt-ha`` commands show, what
    ``ckpt-ha policy advise`` measures). The coordinator's store extends it with the writes."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._p = prefix

    @classmethod
    def from_url(cls, where: str | RedisConfig, prefix: str, **kwargs: Any) -> Self:
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

    async def started(self, job: str, attempt: int) -> Started | None:
        raw = await self._r.get(self._k("started", job, attempt))
        return Started.model_validate_json(raw) if raw else None

    async def failures(self, job: str) -> list[Failure]:
        """The job's logged failures, one per attempt (a failure heard twice is one), in
        attempt order: what ``ckpt-ha policy advise`` measures the failure rate from."""
        raws = await self._r.hgetall(self._k("failures", job))
        return sorted((failure_of(v) for v in raws.values()), key=lambda f: f.attempt)

    async def held(self, job: str) -> bool:
        return await self._r.get(self._k("held", job)) is not None  # (the ACL has no EXISTS)

    async def decision(self, job: str, attempt: int) -> DecisionRecord | None:
        raw = await self._r.get(self._k("decision", job, attempt))
        return DecisionRecord.model_validate_json(raw) if raw else None

    async def plan(self, plan_id: str) -> PlanRecord | None:
        raw = await self._r.get(self._k("plan", plan_id))
        return PlanRecord.model_validate_json(raw) if raw else None

    async def plans_of(self, plan_ids: Sequence[str]) -> dict[str, PlanRecord]:
        ids = list(dict.fromkeys(plan_ids))
        if not ids:
            return {}
        raws = await self._r.mget([self._k("plan", i) for i in ids])
        return {i: PlanRecord.model_validate_json(r) for i, r in zip(ids, raws, strict=True) if r}

    async def verdict(self, plan: str) -> str | None:
        value = await self._r.get(self._k("verdict", plan))
        return str(value) if value else None

    async def verdicts_of(self, plan_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(plan_ids))
        if not ids:
            return {}
        raws = await self._r.mget([self._k("verdict", i) for i in ids])
        return {i: text(r) for i, r in zip(ids, raws, strict=True) if r}

    async def watch(self, job: str) -> Watch | None:
        raw = await self._r.get(self._k("watch", job))
        return Watch.model_validate_json(raw) if raw else None


class JobIndexReader:
    """The job index, a projection of the stream like the rest of the coordinator's state
    (rebuilt with it), never expired:

    * ``<p>:coord:jobs:all``           sorted set: job → when the index first heard of it
      (an ordinal);
    * ``<p>:coord:jobs:log:<job>``     sorted set: the job's events of the event stream (every
      ``job.*`` and ``resume.*``, as published) → their ordinal, in stream order;
    * ``<p>:coord:jobs:reports:<job>`` hash: ``last``, the newest report (``job.heartbeat`` or
      ``job.progress``), and ``step``, the newest naming a step;
    * ``<p>:coord:jobs:seq``           the ordinals' counter.

    A job's events are its log and those two reports merged by time (an event before a report
    of the same instant), as the stream reader merges the two streams: what folds into the
    same summary and timeline as the whole of both streams (`ckpt_ha.ops.jobs`)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._p = prefix

    def _k(self, *parts: str | int) -> str:
        return key(self._p, INDEX, *parts)

    async def jobs(self) -> list[str]:
        """Every job indexed, in the order the index first heard of them."""
        return [text(j) for j in await self._r.zrange(self._k("all"), 0, -1)]

    async def raw_events(self, jobs: Sequence[str]) -> dict[str, tuple[list[bytes], list[bytes]]]:
        """Each job's log (stream order) and its newest reports (at most two: the newest
        naming a step, the newest), as stored, in one round trip."""
        async with self._r.pipeline(transaction=False) as pipe:
            for job in jobs:
                pipe.zrange(self._k("log", job), 0, -1)
                pipe.hmget(self._k("reports", job), ["step", "last"])
            found = await pipe.execute()
        out: dict[str, tuple[list[bytes], list[bytes]]] = {}
        for i, job in enumerate(jobs):
            log, reports = found[2 * i], found[2 * i + 1]
            kept = list(dict.fromkeys(_raw(r) for r in reports if r))
            out[job] = ([_raw(e) for e in log], kept)
        return out


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
