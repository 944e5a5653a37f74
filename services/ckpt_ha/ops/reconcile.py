"""Storage objects the registry does not know (R11): reported, and deleted only when an
operator says so, with a reason that is recorded for every deletion.

The storage root and every replica root (where a replicating tier's copies go): on a replica,
what a live copy of a live checkpoint holds is known; a folder no record names as its copy, a
copy recorded ``deleted`` whose bytes stayed, and the copies of a deleted checkpoint are
leftovers, reported (and deleted) like the primary's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.copies import live_copies
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.ops.errors import DeletionFailed, ListingFailed
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor import api as retention
from ckpt_ha.storage import ObjectStore, StorageError, bounded, key_for_uri

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
    replica: str | None = None
    """The replica root it was found under (None: the storage root)."""

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
        if self.replica is not None:
            doc["replica"] = self.replica
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


def copy_locations(replica: ObjectStore, record: CheckpointRecord) -> tuple[str, ...]:
    """The keys under ``replica`` a record's copies account for: its live copies (every state
    but ``deleted``), none once the checkpoint is deleted (those bytes are leftovers)."""
    if record.state is CheckpointState.DELETED:
        return ()
    uris = [c.uri for c in live_copies(record.copies.values())]
    return tuple(k for u in uris if (k := key_for_uri(replica, u)))


async def reconcile(
    registry: Registry,
    store: ObjectStore,
    *,
    clock: Clock,
    min_age_s: float,
    delete: Deletion | None = None,
    progress: Progress | None = None,
    replicas: Mapping[str, ObjectStore] | None = None,
) -> Reconciliation:
    """Every object no registry record claims, under the storage root and each replica root
    (``replicas``: root → its store); with ``delete``, those older than ``min_age_s`` are
    deleted and each deletion is recorded in the registry's reconcile log."""
    # The registry first: an object registered between the two reads is then listed but known,
    # never the other way round.
    progress = progress or _quiet
    replicas = replicas or {}
    known: list[str] = []
    copies: dict[str, list[str]] = {root: [] for root in replicas}
    jobs = await registry.jobs()
    for done, job in enumerate(jobs, 1):
        for record in await registry.by_job(job):
            known += retention.locations(store, record)
            for root, replica in replicas.items():
                copies[root] += copy_locations(replica, record)
        progress(done, len(jobs), "registry jobs read")
    now = clock()
    found = await _unknown(store, known, now, min_age_s, None)
    for root, replica in replicas.items():
        found += await _unknown(replica, copies[root], now, min_age_s, root)
    progress(len(found), None, "storage objects listed")
    deleted = 0
    if delete is not None:
        where: dict[str | None, ObjectStore] = {None: store}
        where.update(replicas)
        doomed = sum(o.old_enough for o in found)
        for obj in found:
            if not obj.old_enough:
                continue
            try:
                await bounded.call(where[obj.replica].delete, obj.key)
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
            if obj.replica is not None:
                entry["replica"] = obj.replica
            await registry.record_reconcile_deletion(entry)
            obj.deleted = True
            deleted += 1
            progress(deleted, doomed, "deleted")
    return Reconciliation(found, deleted)


async def _unknown(
    store: ObjectStore, known: list[str], now: datetime, min_age_s: float, replica: str | None
) -> list[UnknownObject]:
    try:
        infos = await bounded.call(lambda: list(store.list("")))
    except StorageError as exc:
        raise ListingFailed(exc, replica) from None
    unknown = set(retention.unknown_objects([i.key for i in infos], known))
    return [
        UnknownObject(
            key=i.key,
            uri=store.uri(i.key),
            size=i.size,
            mtime=i.mtime,
            old_enough=(now - i.mtime).total_seconds() >= min_age_s,
            replica=replica,
        )
        for i in infos
        if i.key in unknown
    ]
