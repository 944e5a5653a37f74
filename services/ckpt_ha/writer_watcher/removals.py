"""What files gone from a committed folder mean, by what the registry already decided. Pure.

A listed file missing from a folder that stays is lost bytes (`lost_after_commit`). A committed
folder removed as a whole while a newer checkpoint of its job is still committed on storage is
its writer's deletion, never damage (`settle_gone`): a framework rotating its own checkpoints
(the Trainer's ``save_total_limit``, Lightning's ``save_top_k``, Orbax's ``max_to_keep``) or the
job's own cleanup. A rotation never removes the job's newest checkpoint: when the newest is gone
too, it is a loss (a wiped disk, a deleted prefix), left to the integrity-checker's scrub, which
condemns it (`ckpt_ha.core.rotation`, the rule both share). Only a job (or someone with its rights)
writes in a job's folder, and the platform records its own removals (retention, quarantine, the
closure of a resume) before or as it makes them, so its records say who removed what.
Both wait `REMOVAL_GRACE` first (`ckpt_ha.writer_watcher.domain.observe` keeps the time).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Protocol

from ckpt_ha.contracts.checkpoint import (
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointState,
    CheckpointWriteFailedV1,
    FailureSide,
)
from ckpt_ha.contracts.envelope import EventData
from ckpt_ha.core.corruption import condemn
from ckpt_ha.core.rotation import Order, Removal, removal_of

REMOVAL_GRACE = timedelta(seconds=15)
"""How long a committed folder may stay short of files, or gone, before the watcher decides
what happened: a folder being removed file by file (``shutil.rmtree``) is gone by then, and a
verdict whose quarantine move emptied it has reached the registry."""

WRITER = "writer-rotation"
"""The policy a writer's own deletion is recorded under (`writer_deleted`)."""

UNVERIFIED = frozenset({None, CheckpointState.WRITING, CheckpointState.PENDING_VERIFICATION})
"""Registry states in which lost files mean the write failed (nothing was verified yet)."""


def folder_job_of(folder: str) -> str:
    """The job a ``<job>/<folder>`` belongs to (its first component)."""
    return folder.split("/", 1)[0]


def write_failed(folder: str, cid: str, uri: str, reason: str) -> CheckpointWriteFailedV1:
    """An announced write that will never commit: its writer removed or rewrote the folder."""
    return CheckpointWriteFailedV1(
        job_id=folder_job_of(folder),
        checkpoint_id=cid,
        uri=uri,
        reason=reason,
        side=FailureSide.JOB,
    )


def lost_after_commit(
    folder: str, uri: str, cid: str, gaps: list[str], registered: CheckpointState | None
) -> list[EventData]:
    """Files listed by a commit are gone from a folder that stays; what that means depends on
    the registry's state: not verified → the write failed; valid → the platform lost bytes of
    a good checkpoint (corrupt + quarantined); decided already → nothing."""
    job = folder_job_of(folder)
    if registered in UNVERIFIED:
        return [write_failed(folder, cid, uri, f"files missing after commit: {gaps[:5]}")]
    if registered is CheckpointState.VALID:
        reason = f"files missing after verification: {gaps[:5]}"
        return list(
            condemn(
                job_id=job,
                checkpoint_id=cid,
                uri=uri,
                reason=reason,
                side=FailureSide.INFRASTRUCTURE,
                findings=gaps,
                why_quarantined=reason,
            )
        )
    return []  # corrupt, quarantined, write-failed, expired, deleted: already decided


class Gone(Protocol):
    """A tracked folder as `settle_gone` reads it."""

    @property
    def checkpoint_id(self) -> str: ...

    @property
    def phase(self) -> str: ...

    @property
    def last_change(self) -> datetime: ...

    @property
    def uri(self) -> str: ...

    @property
    def step(self) -> int | None: ...

    @property
    def first_seen(self) -> datetime: ...

    @property
    def written(self) -> datetime | None: ...


COMMITTED = frozenset({"committed"})
"""Phases of a folder present on storage with its commit evidence complete."""

BEING_WRITTEN = frozenset({"new", "writing"})
"""Phases of a folder present on storage, not committed yet."""


def removal(folder: str, folders: Mapping[str, Gone]) -> Removal:
    """What ``folder``, gone as a whole, is by the job's other folders on storage
    (`ckpt_ha.core.rotation.removal_of`): its writer's rotation only while a newer one of its
    job is committed there. Only folders seen before it went count: a rotation writes the newer
    one first, while a job restored after a loss writes its next checkpoint after it."""
    job = folder_job_of(folder)
    went = folders[folder].last_change
    committed: list[Order] = []
    writing: list[Order] = []
    for other, known in folders.items():
        if other == folder or folder_job_of(other) != job or known.first_seen > went:
            continue
        if known.phase in COMMITTED:
            committed.append(_order(known))
        elif known.phase in BEING_WRITTEN:
            writing.append(_order(known))
    return removal_of(_order(folders[folder]), committed, writing)


def _order(known: Gone) -> Order:
    """Where a tracked folder lies in its job: its step, and its first write on storage (when
    first seen, for a state saved before that was kept)."""
    return known.step, known.written or known.first_seen


def settle_gone(
    folders: Mapping[str, Gone],
    now: datetime,
    grace: timedelta,
    registered: Mapping[str, CheckpointState | None],
) -> tuple[list[EventData], list[str]]:
    """The events for committed folders gone (phase ``gone``) for ``grace`` whose registry state
    is known, and the folders decided (to forget): still valid → its writer deleted it
    (`writer_deleted`) when a newer checkpoint of its job is still committed on storage
    (`removal`), else a loss: nothing (the scrub condemns it), or undecided while a newer one
    is still being written; not verified yet → the write failed; decided otherwise
    (quarantined, expired, deleted: the platform moved or removed it) → nothing."""
    events: list[EventData] = []
    decided: list[str] = []
    for folder, known in sorted(folders.items()):
        if known.phase != "gone" or now - known.last_change < grace:
            continue
        if known.checkpoint_id not in registered:
            continue  # not asked this batch (`needs_registry`): decided with the next one
        current = registered[known.checkpoint_id]
        if current is CheckpointState.VALID:
            verdict = removal(folder, folders)
            if verdict is Removal.UNDECIDED:
                continue  # a newer one is being written: decided once it is committed or gone
            if verdict is Removal.ROTATION:
                events.extend(writer_deleted(folder, known.checkpoint_id, known.uri))
            # Removal.LOSS: the job's newest is gone too; the scrub condemns it (names a copy)
        elif current in UNVERIFIED:
            reason = "folder removed after commit, before verification"
            events.append(write_failed(folder, known.checkpoint_id, known.uri, reason))
        decided.append(folder)
    return events, decided


def writer_deleted(folder: str, cid: str, uri: str) -> list[EventData]:
    """The tombstone of a valid checkpoint its writer removed (R6: reason, actor, time): it is
    expired (no longer a restore candidate) and deleted, with the job as actor, never corrupt
    or quarantined: a framework rotating its own checkpoints is no damage, and pages no one."""
    job = folder_job_of(folder)
    actor = f"job:{job}"
    reason = (
        f"deleted by its writer (job {job}): the folder was removed as a whole after it was "
        "registered (a framework's rotation such as save_total_limit, or the job's own cleanup)"
    )
    return [
        CheckpointExpiredV1(
            job_id=job, checkpoint_id=cid, uri=uri, reason=reason, policy=WRITER, actor=actor
        ),
        CheckpointDeletedV1(
            job_id=job,
            checkpoint_id=cid,
            uri=uri,
            reason=reason,
            actor=actor,
            policy=WRITER,
            objects_deleted=0,
        ),
    ]
