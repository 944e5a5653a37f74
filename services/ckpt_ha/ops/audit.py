"""Who removed or kept what, when and why (R6): tombstones, expiries, pins, quarantines, and
the unregistered storage objects `reconcile` deleted.

Tombstones older than the janitor's ``tombstone_hot_days`` are no longer in the registry but in
its archive (`ckpt_ha.retention_janitor.api.StoreArchive`): the audit reads both, and a
tombstone in both (archived, not yet removed from Redis) is shown once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord, HistoryEntry
from ckpt_ha.ops.errors import NothingToAudit
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor.api import TombstoneArchive

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


def merged(
    hot: Sequence[CheckpointRecord], cold: Sequence[CheckpointRecord]
) -> list[CheckpointRecord]:
    """The registry's records, then the archived tombstones it no longer holds."""
    known = {r.checkpoint_id for r in hot}
    return [*hot, *(r for r in cold if r.checkpoint_id not in known)]


async def audit(
    registry: Registry,
    archive: TombstoneArchive | None = None,
    *,
    job_id: str | None = None,
    checkpoint_id: str | None = None,
) -> Audit:
    """One checkpoint, one job's checkpoints, or (neither given) every deleted and expired one,
    from the registry and the tombstone archive. The reconcile log is part of the answer unless
    one checkpoint is asked for."""
    if checkpoint_id:
        record = await registry.get(checkpoint_id)
        if record is None and archive is not None:
            record = await archive.get(checkpoint_id)
        records = [record] if record is not None else []
    elif job_id:
        records = merged(
            await registry.by_job(job_id), await archive.by_job(job_id) if archive else []
        )
    else:
        records = merged(
            [
                *await registry.by_state(CheckpointState.DELETED),
                *await registry.by_state(CheckpointState.EXPIRED),
            ],
            await archive.everything() if archive else [],
        )
    found = audited(records)
    if checkpoint_id and not found:
        raise NothingToAudit(checkpoint_id)
    return Audit(found, [] if checkpoint_id else await registry.reconcile_log())
