"""Registrar decisions: what to announce once the registry has projected a checkpoint event.

Pure. The answer depends only on the event and the record after it, never on whether this
delivery was the first: a redelivery after a lost publish re-derives the same follow-ups with the
same deterministic ids, which JetStream then dedupes.
"""

from __future__ import annotations

from contracts import Envelope, EventData
from contracts.checkpoint import (
    CheckpointConflictV1,
    CheckpointRegisteredV1,
    CheckpointState,
    CheckpointVerifiedV1,
)
from services.shared.lifecycle import IllegalTransition
from services.shared.registry import CheckpointRecord


def follow_ups(event: Envelope[EventData], record: CheckpointRecord | None) -> list[EventData]:
    """A verified checkpoint that the registry now holds as valid is announced as registered."""
    data = event.data
    if (
        isinstance(data, CheckpointVerifiedV1)
        and record is not None
        and record.state is CheckpointState.VALID
        and record.step is not None
    ):
        return [
            CheckpointRegisteredV1(
                job_id=record.job_id,
                checkpoint_id=record.checkpoint_id,
                uri=record.uri,
                step=record.step,
            )
        ]
    return []


def conflict(event: Envelope[EventData], error: IllegalTransition) -> CheckpointConflictV1:
    """An illegal transition is reported as a conflict for humans, besides being dead-lettered."""
    return CheckpointConflictV1(
        job_id=event.data.job_id,
        checkpoint_id=error.checkpoint_id,
        uri=str(getattr(event.data, "uri", "")),
        reason=f"{event.data.EVENT_TYPE} ({event.id}): {error}",
    )
