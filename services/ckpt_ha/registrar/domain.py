"""Registrar decisions: what to announce once the registry has projected a checkpoint event.

Pure. The answer depends only on the event and the registry's answer for it, never on whether
this delivery was the first: a redelivery after a lost publish re-derives the same follow-ups
with the same deterministic ids, which JetStream then dedupes.
"""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointConflictV1,
    CheckpointIdentity,
    CheckpointRegisteredV1,
    CheckpointState,
    CheckpointVerifiedV1,
)
from ckpt_ha.core.lifecycle import IllegalTransition
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
    a conflict."""
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
    return out


def conflict(event: Envelope[EventData], error: IllegalTransition) -> CheckpointConflictV1:
    """An illegal transition is reported as a conflict for humans, besides being dead-lettered."""
    return CheckpointConflictV1(
        job_id=event.data.job_id,
        checkpoint_id=error.checkpoint_id,
        uri=str(getattr(event.data, "uri", "")),
        reason=f"{event.data.EVENT_TYPE} ({event.id}): {error}",
    )
