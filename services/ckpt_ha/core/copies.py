"""Copies of a checkpoint on replicas (a tier that replicates): the record of each copy and
the pure projection of `CheckpointCopyChangedV1` onto them.

A copy is the same checkpoint (same id) at another location, with a state of its own
(`CopyState`); the checkpoint's lifecycle state stays the primary's. The registry keeps the
copies inside the checkpoint's record, so a rebuild from the stream reproduces them and every
reader of a record (a restore plan, retention, ``checkpoints show``) sees them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import AwareDatetime, BaseModel, ConfigDict

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointCopyChangedV1, CopyState


class CopyRecord(BaseModel):
    """One copy of a checkpoint: where, its state, since when, why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str
    state: CopyState
    at: AwareDatetime
    event_id: str
    reason: str | None = None
    tier: str | None = None
    bytes_copied: int = 0
    valid_since: AwareDatetime | None = None
    """When it was last verified valid (kept across a later state: what was lost, and when it
    was last known good)."""


def apply_copy(
    copies: Mapping[str, CopyRecord], event: Envelope[EventData]
) -> dict[str, CopyRecord]:
    """The copies after ``event`` (a `CheckpointCopyChangedV1`): the copy at its ``copy_uri``
    takes the event's state. Only the event's own fields and time: a replay reproduces it."""
    data = event.data
    assert isinstance(data, CheckpointCopyChangedV1)
    old = copies.get(data.copy_uri)
    valid_since = event.time if data.copy_state is CopyState.VALID else None
    if valid_since is None and old is not None:
        valid_since = old.valid_since
    return {
        **copies,
        data.copy_uri: CopyRecord(
            uri=data.copy_uri,
            state=data.copy_state,
            at=event.time,
            event_id=event.id,
            reason=data.reason,
            tier=data.tier,
            bytes_copied=data.bytes_copied,
            valid_since=valid_since,
        ),
    }


def copy_note(data: CheckpointCopyChangedV1) -> str:
    """The history line of a copy's change, for humans."""
    note = f"copy {data.copy_uri}: {data.copy_state.value}"
    return f"{note}: {data.reason}" if data.reason else note


def valid_copies(copies: Mapping[str, CopyRecord]) -> list[CopyRecord]:
    """The copies a restore may use, the most recently verified first."""
    good = [c for c in copies.values() if c.state is CopyState.VALID]
    return sorted(good, key=lambda c: (c.valid_since or c.at, c.uri), reverse=True)


def live_copies(copies: Iterable[CopyRecord]) -> list[CopyRecord]:
    """Copies whose bytes may still be on a replica (every state but deleted): what a deletion
    removes and its tombstone names."""
    return [c for c in copies if c.state is not CopyState.DELETED]
