"""The checkpoint registry in Redis: a projection of the event stream, rebuildable from it.

The key layout is `ckpt_ha.registry.keys` (nothing else formats those keys); the record model
and the projection are `ckpt_ha.core.records` (pure, shared with the in-memory fake); the
Protocols services depend on are `ckpt_ha.registry.port`.

Pins (R6) live in the checkpoint's record (``pins``), expiry and the deletion tombstone too, so a
rebuild from the event stream restores them; a deleted checkpoint's record is its tombstone and
is never removed. The tier a job declared at ``job.started`` is recorded here too (the
retention-janitor writes it live, `ckpt_ha.core.tiers.declared_tier` says which), and a rebuild
replays it from the same events.

A batch of transitions is written by one Lua compare-and-set on the records it read
(`ckpt_ha.registry.projection` holds that script and the one read it starts from), so two
replicas racing on one checkpoint cannot both apply one; the loser re-reads and sees the new
state.

The applied-event ids (dedupe) are scored by their event's time and trimmed by every write to
the last `APPLIED_WINDOW_S` on the registry's clock, so the set holds one window of traffic, not
the whole history; the score is the event's, not the moment it was applied, so a rebuild leaves
exactly the window the live registrar had. Within the window an id is a duplicate because it
is there; past it, every event that changed a record is in that record's history
(`ckpt_ha.core.records.project_batch` dedupes on it too), and an event that changed nothing
changes nothing again.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.core.records import (
    Applied,
    CheckpointRecord,
    FenceKey,
    OwnershipChange,
    TierRecord,
    batch_scope,
    project_batch,
)
from ckpt_ha.core.tiers import TierChoice, resolve_tier
from ckpt_ha.registry.client import RedisConfig, connect, describe
from ckpt_ha.registry.eviction import FORGET_LUA, forget_call
from ckpt_ha.registry.keys import RegistryKeys
from ckpt_ha.registry.lazy_records import RecordsOnRead
from ckpt_ha.registry.port import CheckpointRegistry, RegistryUnavailable
from ckpt_ha.registry.projection import (
    READ_LUA,
    WRITE_LUA,
    RecordWrite,
    ms,
    read_call,
    write_batch,
)

__all__ = ["APPLIED_WINDOW_S", "Registry", "RegistryUnavailable"]

APPLIED_WINDOW_S = 3600.0
"""How long an applied event id is remembered as such, counted from its event's time (kept while
that time is within this much of the registry's clock). It must cover every way the same message
comes back: JetStream's duplicate window (``duplicate_window_s``, 120 s by default: a republish
within it is dropped by the server anyway) and a redelivery (``max_deliver`` times ``ack_wait_s``
plus the nak back-off, minutes). An hour is many times both."""


def _strs(values: Iterable[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


@contextlib.contextmanager
def _reachable() -> Iterator[None]:
    """A Redis failure (a lost connection, a timeout, a server busy loading or read-only) is
    `RegistryUnavailable`: transient, retried, never a decision about a checkpoint."""
    try:
        yield
    except RedisError as exc:
        raise RegistryUnavailable(describe(exc)) from exc


_NEWEST_LUA = """
-- Each job's ARGV[1] newest checkpoint ids (KEYS: the jobs' step indexes), one command for a
-- burst of failures' selections instead of one per job.
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('ZREVRANGE', k, 0, tonumber(ARGV[1]) - 1)
end
return out
"""


class Registry:
    """Async Redis adapter for the checkpoint registry (implements `port.CheckpointRegistry`)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = "ckpt-ha",
        *,
        applied_window_s: float = APPLIED_WINDOW_S,
        clock: Clock = utc_now,
    ) -> None:
        self.r = client
        self.p = prefix
        self.keys = RegistryKeys(prefix)
        self.applied_window_s = applied_window_s
        self.clock = clock
        self._read_script = client.register_script(READ_LUA)
        self._write_script = client.register_script(WRITE_LUA)
        self._forget_script = client.register_script(FORGET_LUA)
        self._newest_script = client.register_script(_NEWEST_LUA)

    @classmethod
    def from_url(
        cls,
        where: str | RedisConfig,
        prefix: str = "ckpt-ha",
        *,
        applied_window_s: float = APPLIED_WINDOW_S,
    ) -> Registry:
        return cls(connect(where), prefix, applied_window_s=applied_window_s)

    async def close(self) -> None:
        await self.r.aclose()

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
        (`IllegalTransition`, `DependencyNotReady`, `OwnershipMismatch`); the other events still
        apply. The write is a compare-and-set on every record and owner read: if another replica
        changed one in between, the whole batch is read and projected again, so two racers never
        both apply a transition.
        """
        if not events:
            return []
        scope = batch_scope(events)
        k = self.keys
        read_keys, read_args = read_call(k, scope, events)
        with _reachable():
            while True:
                # One command for the whole batch (`READ_LUA`), then one compare-and-set.
                seen, owner_raws, raws, at_uri, fence_raws = await self._read_script(
                    keys=read_keys, args=read_args
                )
                planned: dict[FenceKey, int | None] = {
                    run: int(raw) if raw else None
                    for run, raw in zip(scope.fences, fence_raws, strict=True)
                }
                raw_by_id = dict(zip(scope.checkpoint_ids, raws, strict=True))
                before = {
                    i: CheckpointRecord.model_validate_json(raw) if raw else None
                    for i, raw in raw_by_id.items()
                }
                owners: dict[str, str | None] = dict(zip(scope.jobs, owner_raws, strict=True))
                outcome = project_batch(
                    events,
                    [s is not None for s in seen],
                    before,
                    owners,
                    {u: _strs(m) for u, m in zip(scope.uris, at_uri, strict=True)},
                    planned,
                )
                if not outcome.writes:
                    return outcome.results
                changed = [
                    RecordWrite(before[cid], new, raw_by_id[cid])
                    for cid, new in outcome.records.items()
                ]
                batch = write_batch(
                    k,
                    ms(self.clock()) - int(self.applied_window_s * 1000),
                    [(e.id, ms(e.time)) for e in events if e.id in outcome.fresh],
                    changed,
                    outcome.changes,
                    owners,
                    outcome.tiers,
                    planned,
                    outcome.fences,
                )
                if await self._write_script(keys=[k.applied, k.jobs], args=[batch]):
                    return outcome.results

    async def forget_tombstones(self, records: Sequence[CheckpointRecord]) -> list[str]:
        """Remove archived tombstones from the hot index (`ckpt_ha.registry.eviction`): each
        only if its record is still exactly the one given. Returns the ids removed."""
        keys, args = forget_call(self.keys, records)
        if not keys:
            return []
        with _reachable():
            return _strs(await self._forget_script(keys=keys, args=args))

    async def owner(self, job_id: str) -> str | None:
        """The project that owns a job's checkpoints (None: never claimed)."""
        with _reachable():
            value = await self.r.get(self.keys.owner(job_id))
        return str(value) if value else None

    async def owner_log(self, job_id: str) -> list[OwnershipChange]:
        with _reachable():
            raws = await self.r.lrange(self.keys.owner_log(job_id), 0, -1)
        return [OwnershipChange.model_validate_json(r) for r in raws]

    async def chosen_tier(self, job_id: str) -> TierRecord | None:
        """The job's latest explicitly recorded tier choice (None: never chosen)."""
        with _reachable():
            raw = await self.r.get(self.keys.tier(job_id))
        return TierRecord.model_validate_json(raw) if raw else None

    async def tier_log(self, job_id: str) -> list[TierRecord]:
        with _reachable():
            raws = await self.r.lrange(self.keys.tier_log(job_id), 0, -1)
        return [TierRecord.model_validate_json(r) for r in raws]

    async def declared_tier(self, job_id: str) -> str | None:
        """The tier the job's latest ``job.started`` declared (the janitor records it;
        `ckpt_ha.core.tiers.declared_tier`)."""
        with _reachable():
            value = await self.r.get(self.keys.tier_declared(job_id))
        return str(value) if value else None

    async def declare_tier(self, job_id: str, tier: str | None) -> None:
        key = self.keys.tier_declared(job_id)
        with _reachable():
            if tier:
                await self.r.set(key, tier)
            else:
                await self.r.delete(key)

    async def tier_of(self, job_id: str) -> TierChoice:
        """The job's tier and where it comes from (`resolve_tier`)."""
        chosen, declared = await self.chosen_tier(job_id), await self.declared_tier(job_id)
        doc = chosen.model_dump(mode="json") if chosen is not None else None
        return resolve_tier(doc, declared)

    async def planned_attempt(self, job_id: str, run_id: str) -> int | None:
        """The latest attempt planned for a run (None: none): its older attempts are fenced."""
        with _reachable():
            value = await self.r.hget(self.keys.fence(job_id), run_id)
        return int(value) if value else None

    async def jobs_of(self, project: str) -> list[str]:
        with _reachable():
            return sorted(_strs(await self.r.smembers(self.keys.project(project))))

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        with _reachable():
            raw = await self.r.get(self.keys.checkpoint(checkpoint_id))
        return CheckpointRecord.model_validate_json(raw) if raw else None

    async def get_many(self, checkpoint_ids: Sequence[str]) -> list[CheckpointRecord | None]:
        """The records of these checkpoints, in their order, in one round trip."""
        raws = await self._raw_many(checkpoint_ids)
        return [CheckpointRecord.model_validate_json(r) if r else None for r in raws]

    async def _many(self, ids: Iterable[str]) -> list[CheckpointRecord]:
        return [CheckpointRecord.model_validate_json(r) for r in await self._raw_many(ids) if r]

    async def _raw_many(self, ids: Iterable[str]) -> list[Any]:
        """The stored JSON of these checkpoints (None where none), in their order: one MGET."""
        keys = [self.keys.checkpoint(i) for i in ids]
        if not keys:
            return []
        with _reachable():
            raws: list[Any] = await self.r.mget(keys)
        return raws

    async def by_job(
        self, job_id: str, *, state: CheckpointState | None = None
    ) -> list[CheckpointRecord]:
        """A job's checkpoints, newest step first."""
        with _reachable():
            ids = _strs(await self.r.zrevrange(self.keys.job(job_id), 0, -1))
        records = await self._many(ids)
        return [r for r in records if state is None or r.state is state]

    async def by_job_pages(
        self, job_id: str, page_size: int = 64
    ) -> AsyncIterator[list[CheckpointRecord]]:
        """A job's checkpoints, newest step first, ``page_size`` per round trip: for a reader
        that usually needs only the newest few (a restore's selection) of a long history."""
        start = 0
        while True:
            with _reachable():
                ids = _strs(
                    await self.r.zrevrange(self.keys.job(job_id), start, start + page_size - 1)
                )
            if not ids:
                return
            yield await self._many(ids)
            if len(ids) < page_size:
                return
            start += page_size

    async def newest_of_jobs(
        self, job_ids: Sequence[str], count: int
    ) -> dict[str, Sequence[CheckpointRecord]]:
        """Each job's ``count`` newest checkpoints (newest step first, as `by_job_pages`' first
        page): the ids of every job in one script call, their records in one MGET, each parsed
        when first read (`RecordsOnRead`)."""
        jobs = list(dict.fromkeys(job_ids))
        if not jobs:
            return {}
        with _reachable():
            found = await self._newest_script(keys=[self.keys.job(j) for j in jobs], args=[count])
        pages = [_strs(ids) for ids in found]
        every = [i for ids in pages for i in ids]
        raws = dict(zip(every, await self._raw_many(every), strict=True))
        # Parsed as the reader reads them (a selection stops at its second valid record).
        return {
            job: RecordsOnRead([raw for raw in (raws[i] for i in ids) if raw])
            for job, ids in zip(jobs, pages, strict=True)
        }

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        with _reachable():
            ids = sorted(_strs(await self.r.smembers(self.keys.state(state))))
        return await self._many(ids)

    async def by_state_pages(
        self, state: CheckpointState, page_size: int = 500
    ) -> AsyncIterator[list[CheckpointRecord]]:
        """Every checkpoint in ``state``, about ``page_size`` per round trip, in no order (SSCAN:
        one present throughout is read once at least; one that leaves meanwhile may not be)."""
        cursor = 0
        while True:
            with _reachable():
                cursor, ids = await self.r.sscan(self.keys.state(state), cursor, count=page_size)
            if ids:
                yield await self._many(_strs(ids))
            if cursor == 0:
                return

    async def by_uri(self, uri: str) -> list[CheckpointRecord]:
        with _reachable():
            ids = sorted(_strs(await self.r.smembers(self.keys.uri(uri))))
        return await self._many(ids)

    async def jobs(self) -> list[str]:
        with _reachable():
            return sorted(_strs(await self.r.smembers(self.keys.jobs)))

    async def latest_valid(self, job_id: str) -> CheckpointRecord | None:
        for record in await self.by_job(job_id):
            if record.state is CheckpointState.VALID:
                return record
        return None

    async def indexed_states(self, checkpoint_id: str) -> list[CheckpointState]:
        """Every state whose index lists the checkpoint: exactly its record's state when the
        index is consistent (what a race test checks)."""
        with _reachable():
            async with self.r.pipeline(transaction=False) as pipe:
                for state in CheckpointState:
                    pipe.sismember(self.keys.state(state), checkpoint_id)
                member = await pipe.execute()
        return [s for s, m in zip(CheckpointState, member, strict=True) if m]

    async def dump(self) -> dict[str, Any]:
        """Every key under the prefix with its value but the leases (`RegistryKeys.is_transient`):
        what a rebuild must reproduce exactly."""
        out: dict[str, Any] = {}
        with _reachable():
            async for key in self.r.scan_iter(match=self.keys.everything, count=1000):
                if self.keys.is_transient(key):
                    continue
                kind = await self.r.type(key)
                if kind == "string":
                    out[key] = await self.r.get(key)
                elif kind == "set":
                    out[key] = sorted(await self.r.smembers(key))
                elif kind == "zset":
                    out[key] = await self.r.zrange(key, 0, -1, withscores=True)
                elif kind == "list":
                    out[key] = await self.r.lrange(key, 0, -1)
                elif kind == "hash":
                    out[key] = sorted((await self.r.hgetall(key)).items())
        return dict(sorted(out.items()))

    async def clear(self) -> int:
        """Delete every key of this layout the event stream rebuilds (before a rebuild). Returns
        how many.

        Kept: what the stream does not hold (the reconcile log), and the keys other owners keep
        under the prefix (they clear their own; `keys.REBUILT` lists what is cleared here).
        """
        n = 0
        with _reachable():
            async for key in self.r.scan_iter(match=self.keys.everything, count=1000):
                if self.keys.is_rebuilt(key):
                    n += await self.r.delete(key)
        return n

    async def built_from(self) -> str | None:
        """The identity of the event stream this registry was built from (None: not known yet),
        see `ckpt_ha.bus.streams.identity`."""
        with _reachable():
            found = await self.r.get(self.keys.stream)
        return str(found) if found is not None else None

    async def remember_stream(self, identity: str, *, replace: bool = False) -> None:
        """Record the event stream this registry is built from: once, by the first registrar to
        start against it (``replace``: a rebuild, which made it from this stream)."""
        with _reachable():
            await self.r.set(self.keys.stream, identity, nx=not replace)

    async def record_reconcile_deletion(self, entry: dict[str, Any]) -> None:
        """An unregistered storage object deleted by ``ckpt-ha reconcile --delete`` (R6)."""
        with _reachable():
            await self.r.rpush(self.keys.reconcile_log, json.dumps(entry, sort_keys=True))

    async def reconcile_log(self) -> list[dict[str, Any]]:
        with _reachable():
            raws = await self.r.lrange(self.keys.reconcile_log, 0, -1)
        return [json.loads(raw) for raw in raws]


if TYPE_CHECKING:
    _implements: type[CheckpointRegistry] = Registry
