"""What an event records of its job rather than of a checkpoint: who owns the job (R5: the
first checkpoint naming a project claims it, then only an explicit transfer moves it) and the
tier explicitly chosen for it (R13). Pure; `ckpt_ha.core.records.project_batch` calls them.
"""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import OwnershipTransferredV1, TierChosenV1
from ckpt_ha.core.errors import PermanentError
from ckpt_ha.core.record_model import CheckpointRecord, OwnershipChange, TierRecord
from ckpt_ha.core.tiers import TIERS


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
