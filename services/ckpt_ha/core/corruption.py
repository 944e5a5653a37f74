"""How any service says "this checkpoint is corrupt": one `corrupt` + `quarantined` pair. Pure.

The integrity-checker (a failed verification or scrub) and the writer-watcher (shards gone from
a checkpoint that was already valid) report corruption the same way: the `corrupt` fact with its
side and findings, then the checkpoint tagged into quarantine at once, so it is never offered
for restore again and the same bad version is not retried (R7).
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_ha.contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointQuarantinedV1,
    CheckpointState,
    FailureSide,
)
from ckpt_ha.core.records import CheckpointRecord

MAX_FINDINGS = 50
AUTOMATIC_ACTOR = "ckpt-ha/"
"""The history's actor of an automatic step starts with this (the event's source: a service
or the runner); a person's act records the person."""


def awaiting_review(record: CheckpointRecord) -> bool:
    """The checkpoint was found corrupt and no person has acted on it yet: it is corrupt, or
    it was quarantined automatically (a failed verification, load or scrub) out of valid or
    corrupt. A person ends it by releasing it (back to verification), by quarantining it again
    ("reviewed, keep it": the quarantine becomes theirs) or by letting retention expire it; a
    quarantine a person decided, or a partial write set aside, awaits no one.
    What `CkptHaCheckpointCorrupt` pages on, from the registry (never a timer)."""
    if record.state is CheckpointState.CORRUPT:
        return True
    if record.state is not CheckpointState.QUARANTINED:
        return False
    entries = record.history
    entered = next(
        (i for i in range(len(entries) - 1, -1, -1) if entries[i].state is not record.state),
        -1,
    )
    if entered + 1 >= len(entries):
        return False
    came_from = entries[entered].state if entered >= 0 else None
    # Who quarantined it, and anyone who quarantined it again (a pin or a copy is no review).
    automatic = all(
        not e.actor or e.actor.startswith(AUTOMATIC_ACTOR)
        for e in entries[entered + 1 :]
        if e.event_type == CheckpointQuarantinedV1.EVENT_TYPE
    )
    return automatic and came_from in (CheckpointState.VALID, CheckpointState.CORRUPT)


def condemn(
    *,
    job_id: str,
    checkpoint_id: str,
    uri: str,
    reason: str,
    side: FailureSide,
    findings: Sequence[str] = (),
    why_quarantined: str,
) -> tuple[CheckpointCorruptV1, CheckpointQuarantinedV1]:
    """The two events, in the order they must be published. ``quarantine_uri`` is left unset:
    whoever moves the bytes aside fills it in (`ckpt_ha.storage.quarantine_move.isolate`)."""
    base = {"job_id": job_id, "checkpoint_id": checkpoint_id, "uri": uri}
    return (
        CheckpointCorruptV1(
            **base, reason=reason, side=side, findings=tuple(findings[:MAX_FINDINGS])
        ),
        CheckpointQuarantinedV1(**base, reason=why_quarantined),
    )
