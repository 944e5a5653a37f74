"""The checkpoint registry in Redis: a projection of the event stream, rebuildable from it.

Keys (all under one prefix, so tests and stacks can share a Redis):

* ``<p>:ckpt:<id>``      JSON `CheckpointRecord` (state, identity, history)
* ``<p>:job:<job>``      sorted set of checkpoint ids by step
* ``<p>:state:<state>``  set of checkpoint ids in that state
* ``<p>:uri:<uri>``      set of checkpoint ids ever written at that location (display only: a
  resubmitted job writing the same path gets a new checkpoint id)
* ``<p>:jobs``           set of job ids
* ``<p>:applied``        set of event ids already projected (dedupe)

A batch of transitions is written by one Lua compare-and-set on the records it read, so two
replicas racing on one checkpoint cannot both apply one; the loser re-reads and sees the new
state. The projection uses
only the event's own fields and time, never the local clock, so replaying the stream into an empty
Redis reproduces identical records.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contracts import Envelope, EventData
from contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointState,
    CheckpointVerifiedV1,
    CheckpointWritingV1,
)
from services.shared.errors import DependencyNotReady, PermanentError, TransientError
from services.shared.lifecycle import EVENT_TARGETS, Transition, transition


class HistoryEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state: CheckpointState
    at: AwareDatetime
    event_id: str
    event_type: str
    actor: str
    reason: str | None = None


class CheckpointRecord(BaseModel):
    """What the registry knows of one checkpoint. ``uri`` is display only; identity is the id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_id: str
    job_id: str
    run_id: str | None = None
    step: int | None = None
    uri: str
    format: CheckpointFormat = CheckpointFormat.UNKNOWN
    state: CheckpointState
    identity: CheckpointIdentity | None = None
    shard_count: int | None = None
    total_bytes: int | None = None
    exact_resume: bool | None = None
    checksums: dict[str, str] = Field(default_factory=dict)
    """File → ``algorithm:hex`` as verified (from `CheckpointVerifiedV1.checks`); what a scrub
    compares the bytes on storage against."""
    created_at: AwareDatetime
    updated_at: AwareDatetime
    history: tuple[HistoryEntry, ...] = ()


@dataclass(frozen=True)
class Applied:
    record: CheckpointRecord | None
    """The record after this event (also for a duplicate, so follow-ups can be re-published)."""
    transition: Transition | None
    duplicate: bool
    """True when this event id was projected before: nothing changed."""


class RegistryUnavailable(TransientError):
    code = "registry_unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"registry (Redis) unavailable: {reason}")


def _reason(data: EventData) -> str | None:
    # Not getattr(): a missing attribute on a pydantic model is a slow exception path.
    value = data.__dict__.get("reason")
    return value if isinstance(value, str) else None


def checksums_from_checks(checks: Iterable[str]) -> dict[str, str]:
    """The ``file=algorithm:hex`` entries of a verified event's checks, as file → digest.

    Other checks (``sizes``, ``checksums:xxh3_64``) have no ``=`` or no digest after it. A path
    may hold ``=`` itself; a digest never does, so the last one separates them.
    """
    out: dict[str, str] = {}
    for check in checks:
        path, sep, digest = check.rpartition("=")
        algorithm, colon, hexdigest = digest.partition(":")
        if sep and path and colon and algorithm and hexdigest:
            out[path] = digest
    return out


def project(
    record: CheckpointRecord | None, event: Envelope[EventData]
) -> tuple[CheckpointRecord | None, Transition | None]:
    """Pure projection of one checkpoint event onto a record (None: the event moves nothing)."""
    data = event.data
    target = EVENT_TARGETS.get(data.EVENT_TYPE)
    checkpoint_id: str = getattr(data, "checkpoint_id", "")
    if target is None:
        return record, None
    current = record.state if record is not None else None
    if current is None and target not in {
        CheckpointState.WRITING,
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.WRITE_FAILED,
    }:
        # E.g. verified delivered before committed: wait for the earlier event.
        raise DependencyNotReady(f"{data.EVENT_TYPE} for {checkpoint_id}", "its committed event")
    step = transition(checkpoint_id, current, target)
    if not step.changed:
        return record, step
    fields: dict[str, Any] = {}
    if isinstance(data, CheckpointWritingV1 | CheckpointCommittedV1):
        fields.update(run_id=data.run_id, format=data.format)
        if data.step is not None:
            fields["step"] = data.step
    if isinstance(data, CheckpointCommittedV1):
        fields.update(
            identity=data.identity, shard_count=data.shard_count, total_bytes=data.total_bytes
        )
    if isinstance(data, CheckpointVerifiedV1):
        fields["exact_resume"] = data.exact_resume
        fields["checksums"] = checksums_from_checks(data.checks)
    entry = HistoryEntry(
        state=target,
        at=event.time,
        event_id=event.id,
        event_type=data.EVENT_TYPE,
        actor=event.source,
        reason=_reason(data),
    )
    if record is None:
        new = CheckpointRecord(
            checkpoint_id=checkpoint_id,
            job_id=data.job_id,
            uri=getattr(data, "uri", ""),
            state=target,
            created_at=event.time,
            updated_at=event.time,
            history=(entry,),
            **fields,
        )
    else:
        new = record.model_copy(
            update={
                **fields,
                "state": target,
                "updated_at": event.time,
                "history": (*record.history, entry),
            }
        )
    return new, step


def _strs(values: Iterable[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


_WRITE_LUA = """
-- Compare-and-set: write what the Python projection computed, but only if every record is still
-- exactly what that projection read. It decides nothing about the lifecycle itself.
local batch = cjson.decode(ARGV[1])
local p = batch.prefix
for _, r in ipairs(batch.records) do
  local current = redis.call('GET', p .. ':ckpt:' .. r.id)
  local digest = current and redis.sha1hex(current) or ''
  if digest ~= r.expect then return 0 end
end
if #batch.events > 0 then redis.call('SADD', KEYS[1], unpack(batch.events)) end
for _, r in ipairs(batch.records) do
  redis.call('SET', p .. ':ckpt:' .. r.id, r.doc)
  if r.old ~= '' then redis.call('SREM', p .. ':state:' .. r.old, r.id) end
  redis.call('SADD', p .. ':state:' .. r.new, r.id)
  redis.call('SADD', p .. ':jobs', r.job)
  redis.call('SADD', p .. ':uri:' .. r.uri, r.id)
  redis.call('ZADD', p .. ':job:' .. r.job, r.step, r.id)
end
return 1
"""


def _sha1(text: str) -> str:
    """Digest for compare-and-set (matches Lua's redis.sha1hex); not a security boundary."""
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class _RecordWrite:
    old: CheckpointRecord | None
    new: CheckpointRecord
    read: str | None
    """The exact JSON the projection started from (None: no record), for compare-and-set."""


class Registry:
    """Async Redis adapter for the checkpoint registry."""

    def __init__(self, client: aioredis.Redis, prefix: str = "ckpt-ha") -> None:
        self.r = client
        self.p = prefix
        self._write_script = client.register_script(_WRITE_LUA)

    @classmethod
    def from_url(cls, url: str, prefix: str = "ckpt-ha") -> Registry:
        return cls(aioredis.Redis.from_url(url, decode_responses=True), prefix)

    async def close(self) -> None:
        await self.r.aclose()

    def _k(self, *parts: str) -> str:
        return ":".join((self.p, *parts))

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except (RedisConnectionError, RedisTimeoutError, OSError):
            return False

    async def apply(self, event: Envelope[EventData]) -> Applied:
        """Project one checkpoint event atomically; an event id seen before is a no-op."""
        [result] = await self.apply_many([event])
        if isinstance(result, Exception):
            raise result
        return result

    async def apply_many(self, events: Sequence[Envelope[EventData]]) -> list[Applied | Exception]:
        """Project events in order, atomically, in two round trips for the whole batch.

        Returns one result per event: `Applied`, or the error that event alone raised
        (`IllegalTransition`, `DependencyNotReady`); the other events still apply. The write is
        a compare-and-set on every record read: if another replica changed one in between, the
        whole batch is read and projected again, so two racers never both apply a transition.
        """
        ids = list(dict.fromkeys(str(getattr(e.data, "checkpoint_id", "")) for e in events))
        keys = [self._k("ckpt", i) for i in ids]
        applied_key = self._k("applied")
        try:
            while True:
                async with self.r.pipeline(transaction=False) as pipe:
                    pipe.mget(keys)
                    pipe.smismember(applied_key, [e.id for e in events])
                    raws, seen = await pipe.execute()
                raw_by_id = dict(zip(ids, raws, strict=True))
                before = {
                    i: CheckpointRecord.model_validate_json(raw) if raw else None
                    for i, raw in raw_by_id.items()
                }
                records = dict(before)
                results: list[Applied | Exception] = []
                fresh: list[str] = []
                for event, was_seen in zip(events, seen, strict=True):
                    cid = str(getattr(event.data, "checkpoint_id", ""))
                    if was_seen or event.id in fresh:
                        results.append(Applied(records[cid], None, duplicate=True))
                        continue
                    try:
                        new, step = project(records[cid], event)
                    except (PermanentError, TransientError) as exc:
                        results.append(exc)
                        continue
                    records[cid] = new
                    fresh.append(event.id)
                    results.append(Applied(new, step, duplicate=False))
                changed = [
                    _RecordWrite(before[cid], new, raw_by_id[cid])
                    for cid, new in records.items()
                    if new is not None and new is not before[cid]
                ]
                if not fresh and not changed:
                    return results
                if await self._write_script(
                    keys=[applied_key], args=[self._write_batch(fresh, changed)]
                ):
                    return results
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RegistryUnavailable(str(exc)) from exc

    def _write_batch(self, event_ids: list[str], changed: list[_RecordWrite]) -> str:
        return json.dumps(
            {
                "prefix": self.p,
                "events": event_ids,
                "records": [
                    {
                        "id": w.new.checkpoint_id,
                        "expect": hashlib.sha1(w.read.encode(), usedforsecurity=False).hexdigest()
                        if w.read
                        else "",
                        "doc": w.new.model_dump_json(),
                        "old": w.old.state.value if w.old is not None else "",
                        "new": w.new.state.value,
                        "job": w.new.job_id,
                        "uri": w.new.uri,
                        "step": w.new.step if w.new.step is not None else -1,
                    }
                    for w in changed
                ],
            }
        )

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        raw = await self.r.get(self._k("ckpt", checkpoint_id))
        return CheckpointRecord.model_validate_json(raw) if raw else None

    async def _many(self, ids: Iterable[str]) -> list[CheckpointRecord]:
        keys = [self._k("ckpt", i) for i in ids]
        if not keys:
            return []
        raws = await self.r.mget(keys)
        return [CheckpointRecord.model_validate_json(r) for r in raws if r]

    async def by_job(
        self, job_id: str, *, state: CheckpointState | None = None
    ) -> list[CheckpointRecord]:
        """A job's checkpoints, newest step first."""
        ids = _strs(await self.r.zrevrange(self._k("job", job_id), 0, -1))
        records = await self._many(ids)
        return [r for r in records if state is None or r.state is state]

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        ids = sorted(_strs(await self.r.smembers(self._k("state", state.value))))
        return await self._many(ids)

    async def by_uri(self, uri: str) -> list[CheckpointRecord]:
        ids = sorted(_strs(await self.r.smembers(self._k("uri", uri))))
        return await self._many(ids)

    async def jobs(self) -> list[str]:
        return sorted(_strs(await self.r.smembers(self._k("jobs"))))

    async def latest_valid(self, job_id: str) -> CheckpointRecord | None:
        for record in await self.by_job(job_id):
            if record.state is CheckpointState.VALID:
                return record
        return None

    async def dump(self) -> dict[str, Any]:
        """Every key under the prefix with its value: what a rebuild must reproduce exactly."""
        out: dict[str, Any] = {}
        async for key in self.r.scan_iter(match=f"{self.p}:*", count=1000):
            kind = await self.r.type(key)
            if kind == "string":
                out[key] = await self.r.get(key)
            elif kind == "set":
                out[key] = sorted(await self.r.smembers(key))
            elif kind == "zset":
                out[key] = await self.r.zrange(key, 0, -1, withscores=True)
        return dict(sorted(out.items()))

    async def clear(self) -> int:
        """Delete every key under the prefix (before a rebuild). Returns how many."""
        n = 0
        async for key in self.r.scan_iter(match=f"{self.p}:*", count=1000):
            n += await self.r.delete(key)
        return n
