"""R11: closing a verified resume (its failed attempt's leftovers reclaimed, or escalated), and
the operator's rollback refused when it names what is not the job's own valid checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointDeletedV1,
    CheckpointState,
)
from ckpt_ha.contracts.resume import (
    ResumeClosedV1,
)
from ckpt_ha.restore_coordinator.domain.decisions import escalated
from ckpt_ha.restore_coordinator.domain.stops import Escalation, Stop

ACTOR = "restore-coordinator"
"""Who the closure's tombstones name as the deleter (R6)."""


@dataclass(frozen=True)
class Reclaimed:
    """One leftover whose bytes the closure deleted."""

    checkpoint_id: str
    uri: str
    objects_deleted: int
    """Storage objects removed (0: they were already gone)."""
    kept: str = ""
    """What under its location was kept, and why (other live checkpoints' folders)."""

    def cleaned(self) -> str:
        """Its entry in ``resume.closed.cleaned``."""
        return f"{self.uri} ({self.kept})" if self.kept else self.uri


@dataclass(frozen=True)
class Closure:
    events: tuple[EventData, ...]
    escalation: Escalation | None = None


def closure(
    job: str, plan: str, reclaimed: Sequence[Reclaimed], unreclaimable: Sequence[str]
) -> Closure:
    """R11: a tombstone for each leftover whose bytes were deleted (R6: the record ends
    ``deleted``, never listed as ``writing`` with its bytes gone), then ``resume.closed`` with
    what was cleaned; what could not be escalates (a human reclaims it, and its record stays)."""
    reason = f"partial write of the failed attempt, reclaimed when resume plan {plan} closed"
    tombstones = tuple(
        CheckpointDeletedV1(
            job_id=job,
            checkpoint_id=r.checkpoint_id,
            uri=r.uri,
            reason="; ".join(part for part in (reason, r.kept) if part),
            actor=ACTOR,
            objects_deleted=r.objects_deleted,
        )
        for r in reclaimed
    )
    closed = ResumeClosedV1(
        job_id=job,
        plan_id=plan,
        cleaned=tuple(r.cleaned() for r in reclaimed),
        unreclaimable=tuple(unreclaimable),
    )
    if not unreclaimable:
        return Closure((*tombstones, closed))
    stop = Escalation(Stop.UNRECLAIMABLE, "; ".join(unreclaimable))
    return Closure((*tombstones, closed, escalated(job, plan, stop)), stop)


def refuse_rollback(
    job: str, checkpoint_id: str, owner: str | None, state: CheckpointState | None
) -> str | None:
    """Why a rollback of ``job`` to ``checkpoint_id`` (registered for job ``owner`` in
    ``state``; None: not registered) is refused, or None: only a valid checkpoint of the job's
    own is restored."""
    if owner is None or state is None:
        return f"no checkpoint {checkpoint_id} in the registry"
    if owner != job:
        return f"checkpoint {checkpoint_id} belongs to job {owner}, not {job}"
    if state is not CheckpointState.VALID:
        return f"checkpoint {checkpoint_id} is {state.value}, not valid"
    return None
