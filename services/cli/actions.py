"""Manual actions on the registry (quarantine, release, ownership transfer): what an operator may
do, decided from what the registry holds. Pure: the command publishes what these return.

Every manual action is an event carrying its actor and reason; the registrar records it in the
checkpoint's history (or the job's ownership log) with the event's time, so nothing a human did is
lost or anonymous.
"""

from __future__ import annotations

from collections.abc import Mapping

from contracts.checkpoint import (
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointState,
    OwnershipTransferredV1,
)
from services.shared.lifecycle import TRANSITIONS
from services.shared.registry import CheckpointRecord


class ActionRefused(Exception):
    """The registry's state does not allow the action; the message says why and what to do."""


def quarantine(record: CheckpointRecord, reason: str, actor: str) -> CheckpointQuarantinedV1:
    """Take a checkpoint out of the restore candidates by hand."""
    if record.state is CheckpointState.QUARANTINED:
        raise ActionRefused(f"checkpoint {record.checkpoint_id} is already quarantined")
    if CheckpointState.QUARANTINED not in TRANSITIONS[record.state]:
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
