"""Writer-watcher decisions, from what a storage listing shows. Pure: no I/O, no clock reads.

A checkpoint folder is ``<job>/<folder>/…`` under a storage root. Each scan gives, per folder,
the files it holds (path → size) and the newest modification time. From that alone:

* a folder without complete commit evidence → `checkpoint.writing`, once its id is settled:
  two scans in a row derive the same id, so the oldest file is no longer being written (a
  library writing in place moves that file's time, hence the id, with every write; announcing
  each passing id would leave writes that never end);
* complete commit evidence (the format's marker file, and every file it lists present at its
  declared size, or at least that size where the format records only offset+length, and no
  file the format shows as unfinished) → `checkpoint.committed`; a file appearing is never
  enough (what each format's evidence is: `writer_watcher.evidence`);
* no change for longer than the stall timeout while incomplete → `checkpoint.write_failed`
  (job-side: the writer stopped); a folder removed, or rewritten (its oldest file changed),
  before it was committed → write_failed too;
* a listed file that disappears after commit depends on what the registry already decided
  (the handler looks it up and passes it in, see `needs_registry`): not yet verified →
  `write_failed`; already valid → `corrupt` + `quarantined` (the platform lost bytes of a good
  checkpoint) once the folder has stayed short of files for `REMOVAL_GRACE`; corrupt,
  quarantined, failed, expired or deleted → nothing (decided elsewhere; quarantining and
  deleting remove files on purpose);
* a committed folder removed as a whole while a newer checkpoint of its job is still committed
  is its writer's deletion (a framework's rotation: the Trainer's ``save_total_limit``,
  Lightning's ``save_top_k``, Orbax's ``max_to_keep``), never damage: decided `REMOVAL_GRACE`
  after it went (a removal seen half-way, a quarantine move whose verdict the registry has not
  applied yet, settle meanwhile); still valid in the registry → `expired` + `deleted`, a
  tombstone with the job as actor; the job's newest gone too → a loss, nothing (the scrub
  condemns it); not yet verified → `write_failed`; anything else → nothing
  (`ckpt_ha.writer_watcher.removals`, `ckpt_ha.core.rotation`).

The checkpoint id comes from the folder and the time its first file was written, so a job that
is resubmitted and writes the same path again gets a new id and is never confused with the
earlier run. The job is the one whose folder holds the checkpoint: a job owns its folder under
the storage root (`ckpt_ha.core.locations`), so what a manifest claims cannot move a checkpoint
into another job. The run id, and the rest of the identity (R4), come from the identity the
checkpoint declares (the native manifest's identity block, a ckpt-ha intent sidecar) when there
is a valid one of the folder's job; an identity naming another job is a note for a human, never
a claim, and is not announced. A folder that is no job's (its first component is not a job
folder) is not announced at all.

The state is plain data, so the handler can persist it between restarts: a restarted watcher
that loads it announces nothing it announced before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from pydantic import ValidationError

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointState,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    FailureSide,
)
from ckpt_ha.contracts.envelope import EventData
from ckpt_ha.core.locations import folder_job
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats.identity import checkpoint_id
from ckpt_ha.writer_watcher.removals import (
    REMOVAL_GRACE,
    folder_job_of,
    lost_after_commit,
    settle_gone,
    write_failed,
)


@dataclass(frozen=True)
class Evidence:
    """What the format's commit marker says must exist (path → size), or None if absent."""

    format: CheckpointFormat
    required: Mapping[str, int] | None
    step: int | None = None
    run_id: str | None = None
    at_least: frozenset[str] = frozenset()
    """Paths whose required size is a lower bound, not exact: formats such as DCP record
    offset+length of what each file must hold, never the file's size."""
    identity: CheckpointIdentity | None = None
    """The identity the checkpoint declares, when valid (native manifest, ckpt-ha intent)."""
    pending: tuple[str, ...] = ()
    """What the format shows is not finished, whatever the sizes say (a safetensors header not
    all written, a shard its index names that is not there; with ``required`` None, the marker
    awaited): each is a gap."""


@dataclass(frozen=True)
class Observation:
    folder: str
    """``<job>/<folder>`` relative to the storage root."""
    uri: str
    files: Mapping[str, int]
    first_written: datetime
    last_written: datetime
    evidence: Evidence


@dataclass(frozen=True, slots=True)
class Tracked:
    checkpoint_id: str
    first_seen: datetime
    last_change: datetime
    signature: tuple[tuple[str, int], ...]
    phase: str = "new"
    """new → writing → committed | failed; committed → vanishing (short of files, maybe a
    removal in progress) | gone (removed as a whole, decided after `REMOVAL_GRACE`); or ignored
    (no job's folder)."""
    uri: str = ""
    traceparent: str | None = None
    """Trace context of the first event announced for this checkpoint: later ones (committed
    after writing, also after a watcher restart) continue that trace."""
    failure: tuple[str, FailureSide] | None = None
    """Reason and side of the `write_failed` announced for it (phase failed): what a re-drive
    announces again when the registry never recorded it."""
    step: int | None = None
    """The step its commit evidence declares (None: none, or none yet)."""
    written: datetime | None = None
    """When its first file was written (storage's time). With ``step``: whether it is newer
    than a folder of its job gone as a whole (`removals.removal`)."""


@dataclass
class WatchState:
    folders: dict[str, Tracked] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Things a human should know that are not events (the handler logs and clears them)."""
    retry: set[str] = field(default_factory=set)
    """Folders no decision could be made for this scan (`observe`): read again on the next
    one, whether or not their listing changes."""


ACTIVE = frozenset({"new", "writing", "vanishing"})
"""Phases whose next decision depends on time, not only on the folder's files (the id settling,
the stall timeout): such a folder is read on every scan (`to_read`)."""

IGNORED = "ignored"
"""The phase of a folder that is no job's: remembered only so its note is written once."""


def missing(evidence: Evidence, files: Mapping[str, int]) -> list[str]:
    """Files the evidence requires that are absent, of another size, or short of a minimum."""
    if evidence.required is None:
        return ["commit marker", *evidence.pending]
    gaps = list(evidence.pending)
    for path, size in sorted(evidence.required.items()):
        have = files.get(path)
        if path in evidence.at_least:
            if have is None or have < size:
                gaps.append(f"{path} (want at least {size} bytes, have {have or 'none'})")
        elif have != size:
            gaps.append(f"{path} (want {size} bytes, have {'none' if have is None else have})")
    return gaps


def needs_registry(state: WatchState, seen: list[Observation]) -> list[str]:
    """Checkpoint ids whose next decision depends on the registry: committed folders that
    now lack a file their commit evidence lists, and committed folders that are gone."""
    out = [known.checkpoint_id for known in state.folders.values() if known.phase == "gone"]
    for obs in seen:
        known = state.folders.get(obs.folder)
        if (
            known is not None
            and known.phase in ("committed", "vanishing")
            and known.checkpoint_id == checkpoint_id(obs.folder, obs.first_written)
            and obs.evidence.required is not None
            and missing(obs.evidence, obs.files)
        ):
            out.append(known.checkpoint_id)
    return out


def to_read(
    state: WatchState, changed: Collection[str], redriven: Collection[str] = ()
) -> set[str]:
    """The folders a scan must read (list, and read the commit evidence of) so that `observe`
    decides exactly as if it had read every folder: those whose listing ``changed`` (new or
    different), those in a phase decided by time (`ACTIVE`), those left undecided last
    time (`WatchState.retry`) and those a re-drive announces from (``redriven``).

    Every other folder is in a final phase (committed, failed, ignored) with the same files at
    the same sizes, times and versions as when it was last decided: its commit evidence, read
    from those files, is the same, so `observe` would decide nothing for it.
    """
    out = set(changed) | state.retry | set(redriven)
    out.update(folder for folder, known in state.folders.items() if known.phase in ACTIVE)
    return out


def owner(folder: str) -> str | None:
    """The job whose folder holds ``folder`` (None: no job's, so nothing is announced): a job
    folder (`ckpt_ha.core.locations.folder_job`) whose name is also a valid job id."""
    job = folder_job(folder)
    if job is None:
        return None
    try:
        EventData(job_id=job)
    except ValidationError:
        return None
    return job


def _identity(obs: Observation, job: str, notes: list[str]) -> CheckpointIdentity | None:
    """The identity the checkpoint declares, if it is of the folder's job; another job's is a
    note, never a claim (the folder's job owns what lies in it)."""
    identity = obs.evidence.identity
    if identity is not None and identity.job_id != job:
        notes.append(
            f"{obs.folder}: manifest identity names job {identity.job_id!r}, but the checkpoint "
            f"lies in job {job!r}'s folder; announced as {job!r}'s without that identity"
        )
        return None
    return identity


def _committed(obs: Observation, cid: str, notes: list[str]) -> CheckpointCommittedV1:
    job = folder_job_of(obs.folder)
    identity = _identity(obs, job, notes)
    return CheckpointCommittedV1(
        job_id=job,
        checkpoint_id=cid,
        uri=obs.uri,
        run_id=identity.run_id if identity is not None else (obs.evidence.run_id or "unknown"),
        step=obs.evidence.step or 0,
        format=obs.evidence.format,
        identity=identity,
        shard_count=len(obs.evidence.required or {}),
        total_bytes=sum((obs.evidence.required or {}).values()),
    )


def observe(
    state: WatchState,
    seen: list[Observation],
    now: datetime,
    stall_after: timedelta,
    registry: Mapping[str, CheckpointState | None] | None = None,
    storage_trouble: tuple[datetime, str] | None = None,
    vanished: Collection[str] | None = None,
    removal_grace: timedelta = REMOVAL_GRACE,
) -> list[EventData]:
    """Advance the watch state by one scan; return the events to publish, in order.

    ``vanished`` None: ``seen`` is every folder on the root, and a tracked folder missing from
    it is gone. Else ``seen`` holds only the folders this scan read (`to_read`) and
    ``vanished`` the folders gone from the root.

    ``registry`` holds the registry's state for the ids `needs_registry` named (missing: the
    registry does not know the checkpoint). ``storage_trouble`` is the time and message of the
    last storage error the watcher itself hit: a write that stalled while storage was failing is
    classified infrastructure-side, not blamed on the job.
    """
    registered = registry or {}
    events: list[EventData] = []
    for obs in seen:
        # One folder whose content no event can carry (a value past the contract's bounds)
        # is noted and keeps its state; every other folder is still decided.
        try:
            decided, known = _observe_one(
                state, obs, now, stall_after, registered, storage_trouble, removal_grace
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            state.notes.append(
                f"{obs.folder}: no event can describe it ({where}: {first['msg']}); "
                "left as it was, decided again on the next scan"
            )
            state.retry.add(obs.folder)
            continue
        events.extend(decided)
        state.folders[obs.folder] = _placed(_with_failure(known, decided), obs)
    if vanished is None:
        gone: Collection[str] = set(state.folders) - {obs.folder for obs in seen}
    else:
        gone = vanished
    events.extend(_forget_vanished(state, gone, now))
    settled, forget = settle_gone(state.folders, now, removal_grace, registered)
    for folder in forget:
        del state.folders[folder]
    events.extend(settled)
    return events


def _observe_one(
    state: WatchState,
    obs: Observation,
    now: datetime,
    stall_after: timedelta,
    registered: Mapping[str, CheckpointState | None],
    storage_trouble: tuple[datetime, str] | None,
    removal_grace: timedelta = REMOVAL_GRACE,
) -> tuple[list[EventData], Tracked]:
    """One folder's events and its new tracking; raises before changing anything."""
    events: list[EventData] = []
    job = owner(obs.folder)
    signature = tuple(sorted(obs.files.items()))
    known = state.folders.get(obs.folder)
    cid = checkpoint_id(obs.folder, obs.first_written)
    if job is None:
        if known is None:
            state.notes.append(
                f"{obs.folder}: not under a job's own folder (its first component is no "
                "usable job id); not announced"
            )
        return events, Tracked(cid, now, now, signature, phase=IGNORED)
    settled = known is not None and known.checkpoint_id == cid
    if known is None or known.checkpoint_id != cid:  # new, or rewritten from scratch
        if known is not None and known.phase == "writing":
            reason = "rewritten before it was committed (its oldest file changed)"
            events.append(write_failed(obs.folder, known.checkpoint_id, obs.uri, reason))
        known = Tracked(cid, first_seen=now, last_change=now, signature=signature, uri=obs.uri)
    elif known.signature != signature:
        known = replace(known, last_change=now, signature=signature)
    gaps = missing(obs.evidence, obs.files)
    if not gaps:
        if known.phase in ("vanishing", "gone"):  # whole again: what was missing came back
            known = replace(known, phase="committed")
        elif known.phase != "committed":
            events.append(_committed(obs, cid, state.notes))
            known = replace(known, phase="committed")
    elif known.phase in ("committed", "vanishing") and obs.evidence.required is not None:
        state_now = registered.get(cid)
        if state_now is CheckpointState.VALID and known.phase == "committed":
            # Maybe a removal seen half-way (its writer's rotation): decided after the grace.
            known = replace(known, phase="vanishing", last_change=now)
        elif state_now is not CheckpointState.VALID or now - known.last_change >= removal_grace:
            events.extend(lost_after_commit(obs.folder, obs.uri, cid, gaps, state_now))
            known = replace(known, phase="failed")
    elif known.phase == "new" and settled:
        events.append(
            CheckpointWritingV1(
                job_id=job,
                checkpoint_id=cid,
                uri=obs.uri,
                run_id=obs.evidence.run_id or "unknown",
                format=obs.evidence.format,
            )
        )
        known = replace(known, phase="writing")
    elif known.phase == "writing" and now - known.last_change > stall_after:
        events.append(_stalled(obs, cid, gaps, stall_after, known, storage_trouble))
        known = replace(known, phase="failed")
    return events, known


def _placed(known: Tracked, obs: Observation) -> Tracked:
    """``known`` with where ``obs`` lies in its job's sequence (step, first write)."""
    step = obs.evidence.step if obs.evidence.step is not None else known.step
    if (step, obs.first_written) == (known.step, known.written):
        return known
    return replace(known, step=step, written=obs.first_written)


def _with_failure(known: Tracked, decided: list[EventData]) -> Tracked:
    """``known`` with the reason and side of the `write_failed` just decided for it."""
    for data in decided:
        if isinstance(data, CheckpointWriteFailedV1) and data.checkpoint_id == known.checkpoint_id:
            return replace(known, failure=(data.reason, data.side))
    return known


def _stalled(
    obs: Observation,
    cid: str,
    gaps: list[str],
    stall_after: timedelta,
    known: Tracked,
    storage_trouble: tuple[datetime, str] | None,
) -> CheckpointWriteFailedV1:
    """A stalled write is the job's (a rank died, the writer stopped) unless storage was failing
    since the write last made progress: then the platform has to act (R2). The write's last
    progress is its newest file's time on storage when that is earlier than the scan that
    noticed it: during an outage the scans fail, and the first one after it notices files that
    landed before it."""
    reason = f"write stalled for {stall_after}; missing {gaps[:5]}"
    side = FailureSide.JOB
    progressed = min(known.last_change, obs.last_written)
    if storage_trouble is not None and storage_trouble[0] >= progressed:
        at, message = storage_trouble
        side = FailureSide.INFRASTRUCTURE
        reason += f"; storage was failing meanwhile (last error {at.isoformat()}: {message})"
    return CheckpointWriteFailedV1(
        job_id=folder_job_of(obs.folder), checkpoint_id=cid, uri=obs.uri, reason=reason, side=side
    )


def _forget_vanished(state: WatchState, gone: Collection[str], now: datetime) -> list[EventData]:
    """Folders gone from the listing are forgotten (the state stays bounded). One that was still
    being written is reported failed: its writer removed it, it will never commit. A committed
    one is kept as ``gone`` until `_settle_gone` decides it."""
    events: list[EventData] = []
    for folder in sorted(gone):
        known = state.folders.get(folder)
        if known is not None and known.phase in ("committed", "vanishing") and known.uri:
            since = known.last_change if known.phase == "vanishing" else now
            state.folders[folder] = replace(known, phase="gone", last_change=since)
            continue
        if known is not None and known.phase == "gone":
            continue  # listed as gone again by a full scan: its grace runs from the first time
        state.folders.pop(folder, None)
        if known is None:
            continue
        if known.phase == "writing" and known.uri:
            reason = "folder removed before it was committed"
            events.append(write_failed(folder, known.checkpoint_id, known.uri, reason))
    return events


REDRIVEN = "registry still held it as writing"


def overdue_writes(
    stuck: Sequence[CheckpointRecord],
    state: WatchState,
    seen: Sequence[Observation],
    now: datetime,
    deadline: timedelta,
) -> list[EventData]:
    """What the registry missed about writes it holds as ``writing`` since longer than
    ``deadline`` (``stuck``: the registry's writing records on this storage root), decided
    from what this watcher tracks now (``state`` after this scan's `observe`, ``seen`` the scan):

    * a folder it announced committed, still complete → that `committed` again;
    * a write it announced failed → that `write_failed` again (same reason and side);
    * a write it still follows (not yet settled, or changing, or not yet stalled) → nothing:
      the stall timeout decides it, as for any write;
    * no folder holds that write any more (removed, written again under a new id, or never
      seen by the watcher: the writer announced it and died) → `write_failed`: a write that can
      never complete.

    Each event has the id the watcher's own announcement of that fact has (type and checkpoint),
    so re-driving twice, or after the lost announcement is replayed, moves the record once.
    """
    tracked = {t.checkpoint_id: (folder, t) for folder, t in state.folders.items()}
    observed = {obs.folder: obs for obs in seen}
    events: list[EventData] = []
    for record in stuck:
        since = _writing_since(record)
        if not writing_overdue(record, now, deadline) or since is None:
            continue
        found = tracked.get(record.checkpoint_id)
        if found is None or found[1].phase == IGNORED:
            reason = (
                f"write never completed: no write of it at {record.uri} for {now - since} "
                "(its folder is gone or was written again)"
            )
            events.append(_recordwrite_failed(record, reason, FailureSide.UNKNOWN))
            continue
        folder, known = found
        obs = observed.get(folder)
        if known.phase == "committed" and obs is not None and not missing(obs.evidence, obs.files):
            events.append(_committed(obs, known.checkpoint_id, state.notes))
        elif known.phase == "failed" and known.failure is not None:
            reason, side = known.failure
            events.append(_recordwrite_failed(record, reason, side))
        elif known.phase == "failed":
            reason = f"write failed (announced before; {REDRIVEN} after {now - since})"
            events.append(_recordwrite_failed(record, reason, FailureSide.UNKNOWN))
    return events


def writing_overdue(record: CheckpointRecord, now: datetime, deadline: timedelta) -> bool:
    """The registry holds ``record`` as writing since longer than ``deadline``."""
    since = _writing_since(record)
    return record.state is CheckpointState.WRITING and since is not None and now - since >= deadline


def _writing_since(record: CheckpointRecord) -> datetime | None:
    """When the registry's record became ``writing`` (its latest such history entry)."""
    return next(
        (h.at for h in reversed(record.history) if h.state is CheckpointState.WRITING), None
    )


def _recordwrite_failed(record: CheckpointRecord, reason: str, side: FailureSide) -> EventData:
    return CheckpointWriteFailedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        reason=reason,
        side=side,
    )
