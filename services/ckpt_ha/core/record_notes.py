"""The registry's projections that annotate a checkpoint's record without moving its
lifecycle: a pin or unpin, a copy's change, a quarantine kept after a person's review. Each
appends a history entry saying who and why. Pure; `ckpt_ha.core.records.project` calls them.
"""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCopyChangedV1,
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
)
from ckpt_ha.core.copies import apply_copy, copy_note
from ckpt_ha.core.errors import DependencyNotReady, PermanentError
from ckpt_ha.core.record_model import CheckpointRecord, HistoryEntry, PinRecord


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


def kept_quarantined(
    record: CheckpointRecord | None, event: Envelope[EventData], data: CheckpointQuarantinedV1
) -> CheckpointRecord | None:
    """Pure: a person quarantining a checkpoint already quarantined ("reviewed, keep it"). The
    lifecycle does not move; the history records the person, which makes the quarantine a
    person's (`ckpt_ha.core.corruption.awaiting_review`: no longer paged)."""
    if record is None:
        return record
    entry = HistoryEntry(
        state=record.state,
        at=event.time,
        event_id=event.id,
        event_type=data.EVENT_TYPE,
        actor=data.actor or event.source,
        reason=f"kept quarantined after review: {data.reason}",
    )
    return record.model_copy(update={"updated_at": event.time, "history": (*record.history, entry)})


def copy_changed(record: CheckpointRecord | None, event: Envelope[EventData]) -> CheckpointRecord:
    """Pure: a copy's change applied to a record. The lifecycle does not move; the history says
    which copy, its state and why."""
    data = event.data
    assert isinstance(data, CheckpointCopyChangedV1)
    if record is None:
        raise DependencyNotReady(f"{data.EVENT_TYPE} for {data.checkpoint_id}", "its record")
    entry = HistoryEntry(
        state=record.state,
        at=event.time,
        event_id=event.id,
        event_type=data.EVENT_TYPE,
        actor=data.actor or event.source,
        reason=copy_note(data),
    )
    return record.model_copy(
        update={
            "copies": apply_copy(record.copies, event),
            "updated_at": event.time,
            "history": (*record.history, entry),
        }
    )
