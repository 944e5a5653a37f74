"""The checkpoint registry's record model and its pure projection of the event stream.

Pure: no Redis, no asyncio, no clock. `project` moves one record by one event (a pin, a copy's
change or a quarantine kept after review only annotate it: `ckpt_ha.core.record_notes`),
`ckpt_ha.core.job_records` derives what an event records of its job (owner, tier), and
`project_batch` applies a batch of events to what a registry read for them: the Redis adapter
and the in-memory fake both call it, so the registry's semantics (dedupe on the event id, one
result per event, an error of one event never stopping the others, conflicts at one URI) are
written once.

The projection uses only the event's own fields and time, never the local clock, so replaying
the stream into an empty registry reproduces identical records. The records themselves are
defined in `ckpt_ha.core.record_model`; import them from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCopyChangedV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    CheckpointVerifiedV1,
    CheckpointWritingV1,
    TierChosenV1,
)
from ckpt_ha.contracts.resume import ResumePlannedV1
from ckpt_ha.core.copies import live_copies
from ckpt_ha.core.errors import DependencyNotReady, PermanentError, TransientError
from ckpt_ha.core.job_records import own, tier_record
from ckpt_ha.core.lifecycle import (
    DECISIONS,
    EVENT_TARGETS,
    Transition,
    awaits_earlier,
    fenced,
    transition,
)
from ckpt_ha.core.locations import JobMismatch
from ckpt_ha.core.record_model import CheckpointRecord as CheckpointRecord
from ckpt_ha.core.record_model import Expiry as Expiry
from ckpt_ha.core.record_model import HistoryEntry as HistoryEntry
from ckpt_ha.core.record_model import OwnershipChange as OwnershipChange
from ckpt_ha.core.record_model import PinRecord as PinRecord
from ckpt_ha.core.record_model import TierRecord as TierRecord
from ckpt_ha.core.record_model import Tombstone as Tombstone
from ckpt_ha.core.record_notes import copy_changed, kept_quarantined, pin

FenceKey = tuple[str, str]
"""(job id, run id): what a fence is kept for. A new run id of the same job is never fenced."""


def fence_key(event: Envelope[EventData]) -> FenceKey | None:
    """The run whose fence an event sets (a plan) or is judged against (a commit naming an
    attempt in its identity); None for every other event."""
    data = event.data
    if isinstance(data, ResumePlannedV1):
        return (data.job_id, data.failed_run_id)
    if isinstance(data, CheckpointCommittedV1) and data.identity is not None:
        return (data.job_id, data.identity.run_id)
    return None


FENCEABLE = frozenset({None, CheckpointState.WRITING, CheckpointState.PENDING_VERIFICATION})
"""States in which a commit is still being handled: a fence applies to it. A checkpoint already
verified (or failed) before the plan stays as it is; only commits handled after the fence is
known are fenced."""


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


def job_mismatch(record: CheckpointRecord | None, data: EventData) -> JobMismatch | None:
    """Why an event (``data``) may not touch ``record`` for job reasons (None: it may): it names
    another job than the record's, or it is a commit declaring another job's identity."""
    checkpoint_id = str(getattr(data, "checkpoint_id", ""))
    changes = data.EVENT_TYPE in EVENT_TARGETS or isinstance(
        data, CheckpointPinnedV1 | CheckpointUnpinnedV1 | CheckpointCopyChangedV1
    )
    if not changes:  # a report (registered, conflict) moves no record: nothing to refuse
        return None
    if record is not None and data.job_id != record.job_id:
        return JobMismatch(
            data.job_id, checkpoint_id, data.EVENT_TYPE, "the checkpoint belongs to another job"
        )
    if (
        isinstance(data, CheckpointCommittedV1)
        and data.identity is not None
        and data.identity.job_id != data.job_id
    ):
        return JobMismatch(
            data.job_id,
            checkpoint_id,
            data.EVENT_TYPE,
            f"its identity names job {data.identity.job_id!r}",
        )
    return None


def fences(record: CheckpointRecord | None, data: EventData, planned: int | None) -> bool:
    """Whether ``data`` is a commit a fence refuses (R17): its identity names an attempt below
    ``planned`` (the latest planned attempt of its run), and the checkpoint is still being
    handled (`FENCEABLE`; one pending with an identity bound was handled before the fence)."""
    if not isinstance(data, CheckpointCommittedV1) or data.identity is None:
        return False
    if not fenced(data.identity.attempt, planned):
        return False
    if record is None or record.state is CheckpointState.WRITING:
        return True
    return record.state is CheckpointState.PENDING_VERIFICATION and record.identity is None


def project(
    record: CheckpointRecord | None, event: Envelope[EventData], planned: int | None = None
) -> tuple[CheckpointRecord | None, Transition | None]:
    """Pure projection of one checkpoint event onto a record (None: the event moves nothing).

    A record belongs to its job: an event naming another job than the record's, or a commit
    declaring the identity of another job, is refused (`JobMismatch`) and changes nothing.
    ``planned``: the latest attempt planned for the run a commit's identity names (None: none);
    a commit of an older attempt is held as ``fenced`` (`fences`).
    """
    data = event.data
    refused = job_mismatch(record, data)
    if refused is not None:
        raise refused
    if isinstance(data, CheckpointPinnedV1 | CheckpointUnpinnedV1):
        return pin(record, event), None
    if isinstance(data, CheckpointCopyChangedV1):
        return copy_changed(record, event), None
    target = EVENT_TARGETS.get(data.EVENT_TYPE)
    checkpoint_id: str = getattr(data, "checkpoint_id", "")
    if target is None:
        return record, None
    fence = fences(record, data, planned)
    if fence:
        target = CheckpointState.FENCED
    current = record.state if record is not None else None
    if current is None and target not in {
        CheckpointState.WRITING,
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.WRITE_FAILED,
        CheckpointState.FENCED,
    }:
        # E.g. verified delivered before committed: wait for the earlier event.
        raise DependencyNotReady(f"{data.EVENT_TYPE} for {checkpoint_id}", "its committed event")
    report = data.EVENT_TYPE not in DECISIONS
    if awaits_earlier(current, target, report=report):
        # E.g. verified heard before committed by another registrar replica: wait for it.
        assert current is not None
        raise DependencyNotReady(
            f"{data.EVENT_TYPE} for {checkpoint_id}", f"the event before it (still {current.value})"
        )
    step = transition(checkpoint_id, current, target, report=report)
    if not step.changed and isinstance(data, CheckpointQuarantinedV1) and data.actor:
        return kept_quarantined(record, event, data), step
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
    if fence:
        fields["fenced_by"] = planned
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
            copies=tuple(c.uri for c in live_copies((record.copies if record else {}).values())),
        )
    entry = HistoryEntry(
        state=target,
        at=event.time,
        event_id=event.id,
        event_type=data.EVENT_TYPE,
        actor=_field(data, "actor") or event.source,
        reason=_field(data, "reason") or (fence_reason(data, planned) if fence else None),
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


def fence_reason(data: EventData, planned: int | None) -> str:
    """Why a commit was fenced, for humans (the record's history, ``checkpoint.fenced``)."""
    assert isinstance(data, CheckpointCommittedV1)
    assert data.identity is not None
    return (
        f"committed by attempt {data.identity.attempt} of run {data.identity.run_id} after "
        f"attempt {planned} was planned: a stale writer; never verified, never restored"
    )


def checkpoint_id_of(event: Envelope[EventData]) -> str:
    """The checkpoint an event concerns ('' for job-level events such as a tier choice, and
    for events of other aggregates: a plan names its restore target, but moves no record)."""
    if not event.event_type.startswith("checkpoint."):
        return ""
    return str(getattr(event.data, "checkpoint_id", ""))


@dataclass(frozen=True)
class BatchScope:
    """What a registry must read before projecting a batch: its records, owners and URIs."""

    checkpoint_ids: list[str]
    jobs: list[str]
    uris: list[str]
    fences: list[FenceKey] = field(default_factory=list)
    """The runs whose latest planned attempt the batch sets or is judged against."""


def batch_scope(events: Sequence[Envelope[EventData]]) -> BatchScope:
    ids = [i for i in dict.fromkeys(checkpoint_id_of(e) for e in events) if i]
    jobs = list(dict.fromkeys(e.data.job_id for e in events))
    uris = list(dict.fromkeys(u for e in events if (u := _field(e.data, "uri"))))
    runs = [k for k in dict.fromkeys(fence_key(e) for e in events) if k is not None]
    return BatchScope(ids, jobs, uris, runs)


@dataclass
class BatchOutcome:
    """What projecting a batch decided: one result per event, and what to write."""

    results: list[Applied | Exception]
    fresh: list[str] = field(default_factory=list)
    """Event ids applied for the first time (to record as applied)."""
    records: dict[str, CheckpointRecord] = field(default_factory=dict)
    """Records that changed (checkpoint id → new record)."""
    changes: list[OwnershipChange] = field(default_factory=list)
    tiers: list[TierRecord] = field(default_factory=list)
    fences: dict[FenceKey, int] = field(default_factory=dict)
    """Runs whose latest planned attempt rose (run → that attempt)."""

    @property
    def writes(self) -> bool:
        return bool(self.fresh or self.records)


def in_history(record: CheckpointRecord | None, event_id: str) -> bool:
    """Whether ``event_id`` already changed ``record`` (a transition or a pin: each leaves an
    entry). The registry's window of applied ids forgets; a record's history does not, so a
    message redelivered or republished after the window is still recognised."""
    return record is not None and any(h.event_id == event_id for h in record.history)


def project_batch(
    events: Sequence[Envelope[EventData]],
    seen: Sequence[bool],
    records: Mapping[str, CheckpointRecord | None],
    owners: Mapping[str, str | None],
    ids_at_uri: Mapping[str, Iterable[str]],
    planned: Mapping[FenceKey, int | None] | None = None,
) -> BatchOutcome:
    """Project ``events`` in order onto what the registry read for them (`batch_scope`).

    ``seen[i]`` says event i's id was applied before, as far as the registry's window of
    applied ids remembers; an event in its record's history (`in_history`) was too, however
    long ago (a duplicate either way: nothing changes, but the
    result carries the record, owner and, for a redelivered creator, its URI conflict again so
    follow-ups can be re-published). An event that raises a `PermanentError` or
    `TransientError` gets that error as its result; the others still apply. ``planned``: the
    latest planned attempt of each run in `BatchScope.fences` (a ``resume.planned`` of the
    batch raises it for the events after it).
    """
    before = dict(records)
    current = dict(records)
    owned = dict(owners)
    at_uri = {u: set(ids) for u, ids in ids_at_uri.items()}
    latest = dict(planned or {})
    out = BatchOutcome(results=[])
    fresh: set[str] = set()  # `out.fresh` as a set: a list lookup per event was quadratic
    for event, was_seen in zip(events, seen, strict=True):
        cid = checkpoint_id_of(event)
        job = event.data.job_id
        if was_seen or event.id in fresh or in_history(current.get(cid), event.id):
            record = current.get(cid)
            others: tuple[str, ...] = ()
            if record is not None and record.history[0].event_id == event.id:
                # Redelivered creator: re-derive its conflict (the publish may be lost).
                others = tuple(sorted(at_uri.get(record.uri, set()) - {cid}))
            out.results.append(
                Applied(record, None, duplicate=True, owner=owned.get(job), others_at_uri=others)
            )
            continue
        try:
            old = current.get(cid)
            run = fence_key(event)
            plan = latest.get(run) if run is not None else None
            new, step = project(old, event, plan) if cid else (None, None)
            if (
                isinstance(event.data, ResumePlannedV1)
                and run is not None
                and event.data.attempt > (latest.get(run) or 0)
            ):
                latest[run] = out.fences[run] = event.data.attempt
            change = own(owned.get(job), event, new)
            if isinstance(event.data, TierChosenV1):
                out.tiers.append(tier_record(event))
        except (PermanentError, TransientError) as exc:
            out.results.append(exc)
            continue
        others = ()
        if cid:
            current[cid] = new
            if old is None and new is not None:
                ids = at_uri.setdefault(new.uri, set())
                others = tuple(sorted(ids - {cid}))
                ids.add(cid)
        if change is not None:
            out.changes.append(change)
            owned[job] = change.to_project
        out.fresh.append(event.id)
        fresh.add(event.id)
        out.results.append(
            Applied(new, step, duplicate=False, owner=owned.get(job), others_at_uri=others)
        )
    out.records = {
        cid: new for cid, new in current.items() if new is not None and new is not before.get(cid)
    }
    return out
