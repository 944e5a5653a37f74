"""The checkpoint registry in Redis: a projection of the event stream, rebuildable from it.

Keys (all under one prefix, so tests and stacks can share a Redis):

* ``<p>:ckpt:<id>``      JSON `CheckpointRecord` (state, identity, history)
* ``<p>:job:<job>``      sorted set of checkpoint ids by step
* ``<p>:state:<state>``  set of checkpoint ids in that state
* ``<p>:uri:<uri>``      set of checkpoint ids ever written at that location (display only: a
  resubmitted job writing the same path gets a new checkpoint id)
* ``<p>:jobs``           set of job ids
* ``<p>:applied``        set of event ids already projected (dedupe)
* ``<p>:owner:<job>``    the project that owns a job's checkpoints (R5): claimed by the first
  checkpoint whose identity names a project, changed only by a recorded transfer
* ``<p>:project:<proj>`` set of job ids the project owns
* ``<p>:owner-log:<job>`` list of ownership changes (JSON: from, to, actor, at, reason, event)
* ``<p>:tier:<job>``     JSON `TierRecord`: the job's latest explicitly chosen tier (R13)
* ``<p>:tier-log:<job>`` list of tier choices (JSON `TierRecord`), oldest first
* ``<p>:tier-declared:<job>`` the tier the job's latest ``job.started`` declared (janitor writes)
* ``<p>:reconcile-log``  list of unregistered storage objects deleted by ``reconcile --delete``

Pins (R6) live in the checkpoint's record (``pins``), expiry and the deletion tombstone too, so a
rebuild from the event stream restores them; a deleted checkpoint's record is its tombstone and
is never removed.

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

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    CheckpointVerifiedV1,
    CheckpointWritingV1,
    OwnershipTransferredV1,
    TierChosenV1,
)
from ckpt_ha.core.errors import DependencyNotReady, PermanentError, TransientError
from ckpt_ha.core.lifecycle import DECISIONS, EVENT_TARGETS, Transition, transition
from ckpt_ha.core.tiers import TIERS, TierChoice, resolve_tier


class HistoryEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state: CheckpointState
    at: AwareDatetime
    event_id: str
    event_type: str
    actor: str
    reason: str | None = None


class PinRecord(BaseModel):
    """Someone (``by``) still needs the checkpoint; retention keeps it while the pin stands."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str
    reason: str
    actor: str
    at: AwareDatetime
    event_id: str


class Expiry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str
    policy: str
    tier: str | None = None
    grace_until: AwareDatetime | None = None
    actor: str
    at: AwareDatetime


class Tombstone(BaseModel):
    """What stays of a deleted checkpoint (R6): with the record's id, URI and checksums, why,
    under which policy, by whom and when its bytes were removed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str
    policy: str | None = None
    tier: str | None = None
    actor: str
    at: AwareDatetime
    event_id: str
    objects_deleted: int | None = None


class TierRecord(BaseModel):
    """A recorded, explicit tier choice for a job (R13)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    tier: str
    actor: str
    reason: str
    at: AwareDatetime
    event_id: str


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
    quarantine_uri: str | None = None
    """Where the bytes were moved when quarantined (None: tagged in place, or released)."""
    checksums: dict[str, str] = Field(default_factory=dict)
    """File → ``algorithm:hex`` as verified (from `CheckpointVerifiedV1.checks`); what a scrub
    compares the bytes on storage against."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Evaluation metrics the writer declared at commit (keep-best retention ranks them)."""
    pins: tuple[PinRecord, ...] = ()
    expiry: Expiry | None = None
    tombstone: Tombstone | None = None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    history: tuple[HistoryEntry, ...] = ()
    traceparent: str | None = None
    """W3C trace context of the checkpoint's trace (from its first event that carried one):
    what a later transition (scrub, restore, retention), after any restart, continues and links
    back to."""
    tracestate: str | None = None


class PinRefused(PermanentError):
    """A pin on a checkpoint that is deleted or not in the registry: nothing may point at it."""

    code = "pin_refused"

    def __init__(self, checkpoint_id: str, why: str) -> None:
        self.checkpoint_id = checkpoint_id
        super().__init__(f"checkpoint {checkpoint_id}: pin refused: {why}")


def pin(record: CheckpointRecord | None, event: Envelope[EventData]) -> CheckpointRecord:
    """Pure: a pin or unpin applied to a record. The lifecycle does not move; the history says
    who did it and why."""
    data = event.data
    assert isinstance(data, CheckpointPinnedV1 | CheckpointUnpinnedV1)
    if record is None:
        raise PinRefused(data.checkpoint_id, "not in the registry")
    others = tuple(p for p in record.pins if p.by != data.by)
    if isinstance(data, CheckpointPinnedV1):
        if record.state is CheckpointState.DELETED:
            raise PinRefused(data.checkpoint_id, "it is deleted")
        pins = (
            *others,
            PinRecord(
                by=data.by, reason=data.reason, actor=data.actor, at=event.time, event_id=event.id
            ),
        )
        what = f"pinned by {data.by}"
    else:
        pins = others
        what = f"unpinned by {data.by}"
    entry = HistoryEntry(
        state=record.state,
        at=event.time,
        event_id=event.id,
        event_type=data.EVENT_TYPE,
        actor=data.actor,
        reason=f"{what}: {data.reason}",
    )
    return record.model_copy(
        update={"pins": pins, "updated_at": event.time, "history": (*record.history, entry)}
    )


class OwnershipChange(BaseModel):
    """One entry of a job's ownership log (R5): who moved it, when, from where, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    from_project: str | None
    to_project: str
    actor: str
    at: AwareDatetime
    reason: str
    event_id: str


@dataclass(frozen=True)
class Applied:
    record: CheckpointRecord | None
    """The record after this event (also for a duplicate, so follow-ups can be re-published)."""
    transition: Transition | None
    duplicate: bool
    """True when this event id was projected before: nothing changed."""
    owner: str | None = None
    """The project owning the event's job after this event."""
    others_at_uri: tuple[str, ...] = ()
    """For an event that created a record: other checkpoint ids already registered at its URI
    (a resubmitted job writing the same path). Both stay distinct; a human is told."""


class OwnershipMismatch(PermanentError):
    """A transfer names a previous owner the job does not have (someone moved it meanwhile)."""

    code = "ownership_mismatch"

    def __init__(self, job_id: str, expected: str | None, actual: str | None) -> None:
        self.job_id = job_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"job {job_id}: transfer expects owner {expected or '<none>'}, "
            f"but it is owned by {actual or '<none>'}"
        )


def own(
    owner: str | None, event: Envelope[EventData], record: CheckpointRecord | None
) -> OwnershipChange | None:
    """Pure: the ownership change an event makes to its job, if any.

    A job is claimed by the first checkpoint whose identity names a project; after that only an
    explicit transfer that names the current owner moves it (no silent re-claim).
    """
    data = event.data
    if isinstance(data, OwnershipTransferredV1):
        if data.from_project != owner:
            raise OwnershipMismatch(data.job_id, data.from_project, owner)
        if data.to_project == owner:
            return None
        return OwnershipChange(
            job_id=data.job_id,
            from_project=owner,
            to_project=data.to_project,
            actor=data.actor,
            at=event.time,
            reason=data.reason,
            event_id=event.id,
        )
    project = record.identity.project if record and record.identity else None
    if owner is None and project is not None:
        return OwnershipChange(
            job_id=data.job_id,
            from_project=None,
            to_project=project,
            actor=event.source,
            at=event.time,
            reason=f"claimed by checkpoint {record.checkpoint_id if record else '?'}",
            event_id=event.id,
        )
    return None


class UnknownTierChosen(PermanentError):
    code = "unknown_tier"

    def __init__(self, job_id: str, tier: str) -> None:
        self.job_id = job_id
        self.tier = tier
        super().__init__(f"job {job_id}: unknown tier {tier!r} (known: {', '.join(TIERS)})")


def tier_record(event: Envelope[EventData]) -> TierRecord:
    """Pure: the recorded tier choice an event makes (refused for a tier not in the table)."""
    data = event.data
    assert isinstance(data, TierChosenV1)
    if data.tier not in TIERS:
        raise UnknownTierChosen(data.job_id, data.tier)
    return TierRecord(
        job_id=data.job_id,
        tier=data.tier,
        actor=data.actor,
        reason=data.reason,
        at=event.time,
        event_id=event.id,
    )


class RegistryUnavailable(TransientError):
    code = "registry_unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"registry (Redis) unavailable: {reason}")


def _field(data: EventData, name: str) -> str | None:
    # Not getattr(): a missing attribute on a pydantic model is a slow exception path.
    value = data.__dict__.get(name)
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
    if isinstance(data, CheckpointPinnedV1 | CheckpointUnpinnedV1):
        return pin(record, event), None
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
    step = transition(checkpoint_id, current, target, report=data.EVENT_TYPE not in DECISIONS)
    if not step.changed:
        if (
            record is not None
            and record.identity is None
            and isinstance(data, CheckpointCommittedV1)
            and data.identity is not None
        ):
            # The watcher and the writer both announce a commit; the one heard second may be the
            # one that knows the identity (R4). Bind it; the lifecycle does not move.
            record = record.model_copy(update={"identity": data.identity})
        return record, step
    fields: dict[str, Any] = {}
    if isinstance(data, CheckpointWritingV1 | CheckpointCommittedV1):
        fields.update(run_id=data.run_id, format=data.format)
        if data.step is not None:
            fields["step"] = data.step
    if isinstance(data, CheckpointCommittedV1):
        fields.update(shard_count=data.shard_count, total_bytes=data.total_bytes)
        if data.metrics:
            fields["metrics"] = dict(data.metrics)
        if data.identity is not None:
            fields["identity"] = data.identity
    if isinstance(data, CheckpointVerifiedV1):
        fields["exact_resume"] = data.exact_resume
        fields["checksums"] = checksums_from_checks(data.checks)
    if isinstance(data, CheckpointQuarantinedV1) and data.quarantine_uri is not None:
        fields["quarantine_uri"] = data.quarantine_uri
    if isinstance(data, CheckpointReleasedV1):
        fields["quarantine_uri"] = None
    if event.traceparent is not None and (record is None or record.traceparent is None):
        fields.update(traceparent=event.traceparent, tracestate=event.tracestate)

    if isinstance(data, CheckpointExpiredV1):
        fields["expiry"] = Expiry(
            reason=data.reason,
            policy=data.policy,
            tier=data.tier,
            grace_until=data.grace_until,
            actor=data.actor or event.source,
            at=event.time,
        )
    if isinstance(data, CheckpointDeletedV1):
        fields["tombstone"] = Tombstone(
            reason=data.reason,
            policy=data.policy,
            tier=data.tier,
            actor=data.actor,
            at=event.time,
            event_id=event.id,
            objects_deleted=data.objects_deleted,
        )
    entry = HistoryEntry(
        state=target,
        at=event.time,
        event_id=event.id,
        event_type=data.EVENT_TYPE,
        actor=_field(data, "actor") or event.source,
        reason=_field(data, "reason"),
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
for _, o in ipairs(batch.owners) do
  local owner = redis.call('GET', p .. ':owner:' .. o.job) or ''
  if owner ~= o.expect then return 0 end
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
for _, c in ipairs(batch.changes) do
  if c.from ~= '' then redis.call('SREM', p .. ':project:' .. c.from, c.job) end
  redis.call('SADD', p .. ':project:' .. c.to, c.job)
  redis.call('SET', p .. ':owner:' .. c.job, c.to)
  redis.call('RPUSH', p .. ':owner-log:' .. c.job, c.log)
  redis.call('SADD', p .. ':jobs', c.job)
end
for _, t in ipairs(batch.tiers) do
  redis.call('SET', p .. ':tier:' .. t.job, t.doc)
  redis.call('RPUSH', p .. ':tier-log:' .. t.job, t.doc)
  redis.call('SADD', p .. ':jobs', t.job)
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


NOT_REBUILT = ("reconcile-log", "tier-declared:", "coord:", "pins:")
"""Keys under the prefix that are not a projection of the checkpoint stream: the log of
unregistered objects ``ckpt-ha reconcile --delete`` removed, the tier each job declared in its
``job.started`` (the janitor records it), and the restore-coordinator's memory, including the
R15 pins that protect a resumed job's fallback. A rebuild keeps them."""


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
        (`IllegalTransition`, `DependencyNotReady`, `OwnershipMismatch`); the other events still
        apply. The write is a compare-and-set on every record and owner read: if another replica
        changed one in between, the whole batch is read and projected again, so two racers never
        both apply a transition.
        """
        ids = list(dict.fromkeys(str(getattr(e.data, "checkpoint_id", "")) for e in events))
        ids = [i for i in ids if i]
        jobs = list(dict.fromkeys(e.data.job_id for e in events))
        uris = list(dict.fromkeys(u for e in events if (u := _field(e.data, "uri"))))
        keys = [self._k("ckpt", i) for i in ids]
        applied_key = self._k("applied")
        try:
            while True:
                async with self.r.pipeline(transaction=False) as pipe:
                    pipe.smismember(applied_key, [e.id for e in events])
                    pipe.mget([self._k("owner", j) for j in jobs])
                    if keys:  # none when the batch holds only ownership transfers
                        pipe.mget(keys)
                    for uri in uris:
                        pipe.smembers(self._k("uri", uri))
                    seen, owner_raws, *rest = await pipe.execute()
                raws, at_uri = (rest[0], rest[1:]) if keys else ([], rest)
                raw_by_id = dict(zip(ids, raws, strict=True))
                before = {
                    i: CheckpointRecord.model_validate_json(raw) if raw else None
                    for i, raw in raw_by_id.items()
                }
                records = dict(before)
                owners_before: dict[str, str | None] = dict(zip(jobs, owner_raws, strict=True))
                owners = dict(owners_before)
                ids_at_uri = {u: set(_strs(m)) for u, m in zip(uris, at_uri, strict=True)}
                changes: list[OwnershipChange] = []
                tiers: list[TierRecord] = []
                results: list[Applied | Exception] = []
                fresh: list[str] = []
                for event, was_seen in zip(events, seen, strict=True):
                    cid = str(getattr(event.data, "checkpoint_id", ""))
                    job = event.data.job_id
                    if was_seen or event.id in fresh:
                        record = records.get(cid)
                        others: tuple[str, ...] = ()
                        if record is not None and record.history[0].event_id == event.id:
                            # Redelivered creator: re-derive its conflict (the publish may be lost).
                            others = tuple(sorted(ids_at_uri.get(record.uri, set()) - {cid}))
                        results.append(
                            Applied(
                                record,
                                None,
                                duplicate=True,
                                owner=owners[job],
                                others_at_uri=others,
                            )
                        )
                        continue
                    try:
                        old = records.get(cid)
                        new, step = project(old, event) if cid else (None, None)
                        change = own(owners[job], event, new)
                        if isinstance(event.data, TierChosenV1):
                            tiers.append(tier_record(event))
                    except (PermanentError, TransientError) as exc:
                        results.append(exc)
                        continue
                    others = ()
                    if cid:
                        records[cid] = new
                        if old is None and new is not None:
                            at = ids_at_uri.setdefault(new.uri, set())
                            others = tuple(sorted(at - {cid}))
                            at.add(cid)
                    if change is not None:
                        changes.append(change)
                        owners[job] = change.to_project
                    fresh.append(event.id)
                    results.append(
                        Applied(new, step, duplicate=False, owner=owners[job], others_at_uri=others)
                    )
                changed = [
                    _RecordWrite(before[cid], new, raw_by_id[cid])
                    for cid, new in records.items()
                    if new is not None and new is not before[cid]
                ]
                if not fresh and not changed:
                    return results
                batch = self._write_batch(fresh, changed, changes, owners_before, tiers)
                if await self._write_script(keys=[applied_key], args=[batch]):
                    return results
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RegistryUnavailable(str(exc)) from exc

    def _write_batch(
        self,
        event_ids: list[str],
        changed: list[_RecordWrite],
        changes: list[OwnershipChange],
        owners_before: dict[str, str | None],
        tiers: list[TierRecord],
    ) -> str:
        return json.dumps(
            {
                "prefix": self.p,
                "events": event_ids,
                "records": [
                    {
                        "id": w.new.checkpoint_id,
                        "expect": _sha1(w.read) if w.read else "",
                        "doc": w.new.model_dump_json(),
                        "old": w.old.state.value if w.old is not None else "",
                        "new": w.new.state.value,
                        "job": w.new.job_id,
                        "uri": w.new.uri,
                        "step": w.new.step if w.new.step is not None else -1,
                    }
                    for w in changed
                ],
                "owners": [
                    {"job": job, "expect": owners_before.get(job) or ""}
                    for job in dict.fromkeys(c.job_id for c in changes)
                ],
                "changes": [
                    {
                        "job": c.job_id,
                        "from": c.from_project or "",
                        "to": c.to_project,
                        "log": c.model_dump_json(),
                    }
                    for c in changes
                ],
                "tiers": [{"job": t.job_id, "doc": t.model_dump_json()} for t in tiers],
            }
        )

    async def owner(self, job_id: str) -> str | None:
        """The project that owns a job's checkpoints (None: never claimed)."""
        value = await self.r.get(self._k("owner", job_id))
        return str(value) if value else None

    async def owner_log(self, job_id: str) -> list[OwnershipChange]:
        raws = await self.r.lrange(self._k("owner-log", job_id), 0, -1)
        return [OwnershipChange.model_validate_json(r) for r in raws]

    async def chosen_tier(self, job_id: str) -> TierRecord | None:
        """The job's latest explicitly recorded tier choice (None: never chosen)."""
        raw = await self.r.get(self._k("tier", job_id))
        return TierRecord.model_validate_json(raw) if raw else None

    async def tier_log(self, job_id: str) -> list[TierRecord]:
        raws = await self.r.lrange(self._k("tier-log", job_id), 0, -1)
        return [TierRecord.model_validate_json(r) for r in raws]

    async def declared_tier(self, job_id: str) -> str | None:
        """The tier the job's latest ``job.started`` declared (the janitor records it)."""
        value = await self.r.get(self._k("tier-declared", job_id))
        return str(value) if value else None

    async def declare_tier(self, job_id: str, tier: str | None) -> None:
        key = self._k("tier-declared", job_id)
        if tier:
            await self.r.set(key, tier)
        else:
            await self.r.delete(key)

    async def tier_of(self, job_id: str) -> TierChoice:
        """The job's tier and where it comes from (`resolve_tier`)."""
        chosen, declared = await self.chosen_tier(job_id), await self.declared_tier(job_id)
        doc = chosen.model_dump(mode="json") if chosen is not None else None
        return resolve_tier(doc, declared)

    async def jobs_of(self, project: str) -> list[str]:
        return sorted(_strs(await self.r.smembers(self._k("project", project))))

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
            elif kind == "list":
                out[key] = await self.r.lrange(key, 0, -1)
        return dict(sorted(out.items()))

    async def clear(self) -> int:
        """Delete every key the checkpoint stream rebuilds (before a rebuild). Returns how many.

        Kept: what the stream does not hold (`NOT_REBUILT`): the reconcile log and declared tiers.
        """
        n = 0
        async for key in self.r.scan_iter(match=f"{self.p}:*", count=1000):
            if not key.removeprefix(f"{self.p}:").startswith(NOT_REBUILT):
                n += await self.r.delete(key)
        return n

    async def record_reconcile_deletion(self, entry: dict[str, Any]) -> None:
        """An unregistered storage object deleted by ``ckpt-ha reconcile --delete`` (R6)."""
        await self.r.rpush(self._k("reconcile-log"), json.dumps(entry, sort_keys=True))

    async def reconcile_log(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in await self.r.lrange(self._k("reconcile-log"), 0, -1)]
