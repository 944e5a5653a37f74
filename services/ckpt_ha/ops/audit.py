"""Who removed or kept what, when and why (R6): tombstones, expiries, pins, quarantines, and
the unregistered storage objects `reconcile` deleted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord, HistoryEntry
from ckpt_ha.ops.errors import NothingToAudit
from ckpt_ha.registry.redis_registry import Registry

AUDIT_EVENTS = frozenset(
    {
        "checkpoint.expired",
        "checkpoint.deleted",
        "checkpoint.pinned",
        "checkpoint.unpinned",
        "checkpoint.quarantined",
        "checkpoint.released",
    }
)
"""What `ckpt-ha audit` shows of a checkpoint's history: what people and retention did to it."""


def events(record: CheckpointRecord) -> list[HistoryEntry]:
    """The audited entries of a record's history, in order."""
    return [h for h in record.history if h.event_type in AUDIT_EVENTS]


def audited(records: Sequence[CheckpointRecord]) -> list[CheckpointRecord]:
    """The records something audited happened to."""
    return [r for r in records if events(r)]


@dataclass(frozen=True)
class Audit:
    records: list[CheckpointRecord]
    cleaned: list[dict[str, Any]]
    """Unregistered storage objects deleted by `reconcile`, as recorded then."""


async def audit(
    registry: Registry, *, job_id: str | None = None, checkpoint_id: str | None = None
) -> Audit:
    """One checkpoint, one job's checkpoints, or (neither given) every deleted and expired one.
    The reconcile log is part of the answer unless one checkpoint is asked for."""
    if checkpoint_id:
        record = await registry.get(checkpoint_id)
        records = [record] if record is not None else []
    elif job_id:
        records = await registry.by_job(job_id)
    else:
        records = [
            *await registry.by_state(CheckpointState.DELETED),
            *await registry.by_state(CheckpointState.EXPIRED),
        ]
    found = audited(records)
    if checkpoint_id and not found:
        raise NothingToAudit(checkpoint_id)
    return Audit(found, [] if checkpoint_id else await registry.reconcile_log())
