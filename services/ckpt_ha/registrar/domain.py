"""Registrar decisions: what to announce once the registry has projected a checkpoint event.

Pure. The answer depends only on the event and the registry's answer for it, never on whether
this delivery was the first: a redelivery after a lost publish re-derives the same follow-ups
with the same deterministic ids, which JetStream then dedupes.

Fencing (R17): the epoch of an attempt is its attempt number, fixed by the coordinator's plan
(``resume.planned`` names the next attempt of the failed run). The registry keeps the latest
planned attempt per run (`ckpt_ha.core.records.fences` decides, the registry's projection
stores it, a rebuild replays it); a commit of an older attempt of that run handled afterwards is
held as ``fenced`` and announced here once as ``checkpoint.fenced``.
"""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointConflictV1,
    CheckpointFencedV1,
    CheckpointIdentity,
    CheckpointRegisteredV1,
    CheckpointState,
    CheckpointVerifiedV1,
)
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.core.locations import JobMismatch, KeyOf, LocationNotOwned, intake_refusal
from ckpt_ha.core.records import Applied, CheckpointRecord


def bound_identity(record: CheckpointRecord, owner: str | None) -> CheckpointIdentity:
    """The identity a registered checkpoint is bound to (R4): what its writer declared, else what
    the registry knows (job, run, created-at), with the owning project filled in (R5)."""
    identity = record.identity or CheckpointIdentity(
        job_id=record.job_id, run_id=record.run_id or "unknown", created_at=record.created_at
    )
    updates: dict[str, object] = {}
    if identity.created_at is None:
        updates["created_at"] = record.created_at
    if identity.project is None and owner is not None:
        updates["project"] = owner
    return identity.model_copy(update=updates) if updates else identity


def announces_registration(event: Envelope[EventData], applied: Applied) -> bool:
    """Whether the follow-ups may hold a `registered` (so the handler reads the job's tier)."""
    return isinstance(event.data, CheckpointVerifiedV1) and applied.record is not None


def follow_ups(
    event: Envelope[EventData], applied: Applied, tier: str | None = None
) -> list[EventData]:
    """A verified checkpoint the registry now holds as valid is announced as registered, with its
    bound identity and its job's tier; a new checkpoint id at a location that already has one is
    a conflict; a commit the registry fenced is announced as fenced (`fenced`)."""
    data, record = event.data, applied.record
    out: list[EventData] = []
    if record is not None and applied.others_at_uri:
        out.append(
            CheckpointConflictV1(
                job_id=record.job_id,
                checkpoint_id=record.checkpoint_id,
                uri=record.uri,
                existing_checkpoint_id=applied.others_at_uri[-1],
                reason=(
                    f"{record.uri} already holds checkpoint(s) {', '.join(applied.others_at_uri)}:"
                    f" a resubmitted job or a second writer wrote the same path; both are kept"
                    f" under their own ids"
                ),
            )
        )
    if (
        isinstance(data, CheckpointVerifiedV1)
        and record is not None
        and record.state is CheckpointState.VALID
        and record.step is not None
    ):
        identity = bound_identity(record, applied.owner)
        out.append(
            CheckpointRegisteredV1(
                job_id=record.job_id,
                checkpoint_id=record.checkpoint_id,
                uri=record.uri,
                step=record.step,
                identity=identity,
                project=identity.project,
                tier=tier,
            )
        )
    announced = fenced(event, record)
    if announced is not None:
        out.append(announced)
    return out


def fenced(
    event: Envelope[EventData], record: CheckpointRecord | None
) -> CheckpointFencedV1 | None:
    """``checkpoint.fenced`` for the commit that fenced the record (R17), once per checkpoint:
    another announcement of the same commit (the watcher's and the writer's) finds the record
    fenced by an earlier event and says nothing; a redelivery of the fencing commit says it
    again with the same id (deduplicated by JetStream)."""
    data = event.data
    if (
        not isinstance(data, CheckpointCommittedV1)
        or data.identity is None
        or record is None
        or record.state is not CheckpointState.FENCED
        or record.fenced_by is None
    ):
        return None
    by = next((h for h in record.history if h.state is CheckpointState.FENCED), None)
    if by is None or by.event_id != event.id:
        return None
    return CheckpointFencedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        run_id=data.identity.run_id,
        attempt=data.identity.attempt,
        fenced_by=record.fenced_by,
        step=record.step,
        reason=by.reason or "fenced",
    )


REPORTED = (IllegalTransition, LocationNotOwned, JobMismatch)
"""Refusals a human is told about (a `conflict`), besides the event being dead-lettered with
the error's code: an illegal transition, a location the job does not own, an event about
another job's record."""


def refusal(event: Envelope[EventData], key_of: KeyOf) -> LocationNotOwned | None:
    """Refused at intake, before the registry sees it: an event that would register a location
    its job does not own (`ckpt_ha.core.locations.intake_refusal`)."""
    return intake_refusal(event.data, key_of)


def conflict(
    event: Envelope[EventData], error: IllegalTransition | LocationNotOwned | JobMismatch
) -> CheckpointConflictV1:
    """A refused event is reported as a conflict for humans, besides being dead-lettered. It is
    published for the event's own job, and names no other job."""
    return CheckpointConflictV1(
        job_id=event.data.job_id,
        checkpoint_id=error.checkpoint_id or str(getattr(event.data, "checkpoint_id", "-")),
        uri=str(getattr(event.data, "uri", "")) or "-",
        reason=f"{event.data.EVENT_TYPE} ({event.id}): {error}"[:4000],
    )
