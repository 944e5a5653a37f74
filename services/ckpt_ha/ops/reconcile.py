"""Storage objects the registry does not know (R11): reported, and deleted only when an
operator says so, with a reason that is recorded for every deletion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckpt_ha.core.clock import Clock
from ckpt_ha.ops.errors import DeletionFailed, ListingFailed
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor import api as retention
from ckpt_ha.storage import ObjectStore, StorageError, bounded

Progress = Callable[[int, int | None, str], None]
"""``(done, total, phase)``: registry jobs read, storage objects listed, unknown ones deleted."""


def _quiet(done: int, total: int | None, phase: str) -> None:
    pass


@dataclass
class UnknownObject:
    key: str
    uri: str
    size: int
    mtime: datetime
    old_enough: bool
    """Older than the minimum age: never a write in progress, so it may be deleted."""
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "key": self.key,
            "uri": self.uri,
            "size": self.size,
            "mtime": self.mtime.isoformat(),
            "old_enough": self.old_enough,
        }
        if self.deleted:
            doc["deleted"] = True
        return doc


@dataclass(frozen=True)
class Deletion:
    """An operator's order to delete what is unknown, recorded with every deleted object."""

    actor: str
    reason: str


@dataclass(frozen=True)
class Reconciliation:
    unknown: list[UnknownObject]
    deleted: int

    @property
    def clean(self) -> bool:
        """Nothing unknown is left (none found, or every one deleted)."""
        return all(o.deleted for o in self.unknown)


async def reconcile(
    registry: Registry,
    store: ObjectStore,
    *,
    clock: Clock,
    min_age_s: float,
    delete: Deletion | None = None,
    progress: Progress | None = None,
) -> Reconciliation:
    """Every object no registry record claims; with ``delete``, those older than ``min_age_s``
    are deleted and each deletion is recorded in the registry's reconcile log."""
    # The registry first: an object registered between the two reads is then listed but known,
    # never the other way round.
    progress = progress or _quiet
    known: list[str] = []
    jobs = await registry.jobs()
    for done, job in enumerate(jobs, 1):
        for record in await registry.by_job(job):
            known += retention.locations(store, record)
        progress(done, len(jobs), "registry jobs read")
    try:
        infos = await bounded.call(lambda: list(store.list("")))
    except StorageError as exc:
        raise ListingFailed(exc) from None
    progress(len(infos), None, "storage objects listed")
    unknown = set(retention.unknown_objects([i.key for i in infos], known))
    now = clock()
    found = [
        UnknownObject(
            key=i.key,
            uri=store.uri(i.key),
            size=i.size,
            mtime=i.mtime,
            old_enough=(now - i.mtime).total_seconds() >= min_age_s,
        )
        for i in infos
        if i.key in unknown
    ]
    deleted = 0
    if delete is not None:
        doomed = sum(o.old_enough for o in found)
        for obj in found:
            if not obj.old_enough:
                continue
            try:
                await bounded.call(store.delete, obj.key)
            except StorageError as exc:
                raise DeletionFailed(deleted, exc) from None
            entry = {
                "key": obj.key,
                "uri": obj.uri,
                "size": obj.size,
                "actor": delete.actor,
                "reason": delete.reason,
                "at": clock().isoformat(),
            }
            await registry.record_reconcile_deletion(entry)
            obj.deleted = True
            deleted += 1
            progress(deleted, doomed, "deleted")
    return Reconciliation(found, deleted)
