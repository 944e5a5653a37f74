"""Manual actions on the registry (quarantine, release, ownership transfer, pins, tiers): what
an operator may do, decided from what the registry holds. Pure: the operations in
`ckpt_ha.ops.checkpoints`, `.owners` and `.tiers` publish what these return.

Every manual action is an event carrying its actor and reason; the registrar records it in the
checkpoint's history (or the job's ownership log) with the event's time, so nothing a human did is
lost or anonymous.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_ha.contracts.checkpoint import (
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    OwnershipTransferredV1,
    TierChosenV1,
)
from ckpt_ha.core.corruption import awaiting_review
from ckpt_ha.core.lifecycle import TRANSITIONS
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import TIERS, TierChoice
from ckpt_ha.ops.errors import OperationFailed


class ActionRefused(OperationFailed):
    """The registry's state does not allow the action; the message says why and what to do."""


def quarantine(record: CheckpointRecord, reason: str, actor: str) -> CheckpointQuarantinedV1:
    """Take a checkpoint out of the restore candidates by hand. On a checkpoint quarantined
    automatically that awaits review (`awaiting_review`): "reviewed, keep it quarantined", the
    quarantine becomes the person's (recorded in its history; no longer paged)."""
    if record.state is CheckpointState.QUARANTINED:
        if not awaiting_review(record):
            raise ActionRefused(f"checkpoint {record.checkpoint_id} is already quarantined")
    elif CheckpointState.QUARANTINED not in TRANSITIONS[record.state]:
        raise ActionRefused(
            f"checkpoint {record.checkpoint_id} is {record.state.value}: only valid, corrupt or "
            "failed checkpoints can be quarantined (wait until its verification ends)"
        )
    return CheckpointQuarantinedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        reason=reason,
        actor=actor,
    )


def release(record: CheckpointRecord, reason: str, actor: str) -> CheckpointReleasedV1:
    """Send a quarantined checkpoint back to verification after a human looked at it. It becomes
    valid again only if the integrity checks pass."""
    if record.state is not CheckpointState.QUARANTINED:
        raise ActionRefused(
            f"checkpoint {record.checkpoint_id} is {record.state.value}, not quarantined: "
            "nothing to release"
        )
    return CheckpointReleasedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        reason=reason,
        actor=actor,
        quarantine_uri=record.quarantine_uri,
    )


def transfer(
    owners: Mapping[str, str | None],
    from_project: str | None,
    to_project: str,
    reason: str,
    actor: str,
) -> list[OwnershipTransferredV1]:
    """One transfer per job, each naming the owner the operator saw (the registrar refuses it if
    the job moved meanwhile). ``owners``: the jobs to move and their current owners."""
    if not owners:
        source = from_project or "<no project>"
        raise ActionRefused(f"no jobs owned by {source} to transfer")
    if from_project == to_project:
        raise ActionRefused(f"jobs are already owned by {to_project}")
    wrong = sorted(job for job, owner in owners.items() if owner != from_project)
    if wrong:
        have = ", ".join(f"{job} ({owners[job] or 'no project'})" for job in wrong)
        raise ActionRefused(f"not owned by {from_project or 'no project'}: {have}")
    return [
        OwnershipTransferredV1(
            job_id=job,
            from_project=from_project,
            to_project=to_project,
            reason=reason,
            actor=actor,
        )
        for job in sorted(owners)
    ]


def pin(record: CheckpointRecord, by: str, reason: str, actor: str) -> CheckpointPinnedV1:
    """Keep a checkpoint for an evaluation or a candidate model: retention never deletes it
    while the pin stands. Nothing may point at a deleted checkpoint, so that is refused."""
    if record.state is CheckpointState.DELETED:
        deleted = record.tombstone.at.isoformat() if record.tombstone else "earlier"
        raise ActionRefused(
            f"checkpoint {record.checkpoint_id} was deleted ({deleted}); see `ckpt-ha audit "
            f"--checkpoint {record.checkpoint_id}`"
        )
    if any(p.by == by for p in record.pins):
        raise ActionRefused(f"checkpoint {record.checkpoint_id} is already pinned by {by}")
    return CheckpointPinnedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        by=by,
        reason=reason,
        actor=actor,
    )


def unpin(record: CheckpointRecord, by: str, reason: str, actor: str) -> CheckpointUnpinnedV1:
    if not any(p.by == by for p in record.pins):
        held = ", ".join(p.by for p in record.pins) or "nobody"
        raise ActionRefused(
            f"checkpoint {record.checkpoint_id} is not pinned by {by} (pinned by: {held})"
        )
    return CheckpointUnpinnedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        by=by,
        reason=reason,
        actor=actor,
    )


def choose_tier(
    job_id: str, current: TierChoice, tier: str, reason: str, actor: str, *, known_job: bool
) -> TierChosenV1:
    """An explicit, recorded tier choice (R13). The tier must exist and the job be known."""
    if tier not in TIERS:
        raise ActionRefused(f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
    if not known_job:
        raise ActionRefused(
            f"no job {job_id!r} in the registry (a job that has not written a checkpoint yet "
            "declares its tier at start: `ckpt-ha run --tier NAME`)"
        )
    if current.source == "chosen" and current.tier.name == tier:
        raise ActionRefused(f"job {job_id} already has tier {tier} ({current.detail})")
    return TierChosenV1(job_id=job_id, tier=tier, reason=reason, actor=actor)
