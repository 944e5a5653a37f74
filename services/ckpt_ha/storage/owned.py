"""A job's own locations in a store, and removing one record's bytes without another's.

The rules are `ckpt_ha.core.locations` (pure); this module applies them to a store: the key of
a location its job owns (`owned_key`, `owned_quarantine_key`), the other live records' bytes
around a location (`neighbours`), and the one way any service deletes a record's bytes
(`remove`). Every service that reads, moves or deletes checkpoint bytes goes through here.

Neighbours are read from the job's own records: with ownership checked at intake, every record
whose location lies under ``<job>/`` is that job's (records registered before the rule existed
are not looked for elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.locations import (
    LocationNotOwned,
    Neighbour,
    Removal,
    contains,
    not_owned,
    quarantine_not_owned,
)
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.storage import key_for_uri
from ckpt_ha.storage.errors import StorageUnavailable
from ckpt_ha.storage.port import ObjectInfo, ObjectStore
from ckpt_ha.storage.quarantine import taking_apart


class JobRecords(Protocol):
    """The registry's records of one job (what `neighbours` are read from)."""

    async def by_job(self, job_id: str) -> list[CheckpointRecord]: ...


def owned_key(store: ObjectStore, job_id: str, checkpoint_id: str, uri: str) -> str:
    """The key of ``uri`` in ``store``; `LocationNotOwned` unless it lies under the job's own
    folder."""
    key = key_for_uri(store, uri)
    why = not_owned(job_id, key)
    if why is not None or key is None:
        raise LocationNotOwned(job_id, checkpoint_id, uri, why or "outside the storage root")
    return key


def owned_quarantine_key(store: ObjectStore, job_id: str, checkpoint_id: str, uri: str) -> str:
    """The key of a quarantine copy ``uri``; `LocationNotOwned` unless it lies under the job's
    own quarantine folder."""
    key = key_for_uri(store, uri)
    why = quarantine_not_owned(job_id, key)
    if why is not None or key is None:
        raise LocationNotOwned(job_id, checkpoint_id, uri, why or "outside the storage root")
    return key


def record_keys(store: ObjectStore, record: CheckpointRecord) -> tuple[str, ...]:
    """Every location of ``record`` to delete, each checked to be its job's: its own location
    and, if moved there, its quarantine copy. Raises `LocationNotOwned` for either."""
    keys = [owned_key(store, record.job_id, record.checkpoint_id, record.uri)]
    if record.quarantine_uri:
        keys.append(
            owned_quarantine_key(store, record.job_id, record.checkpoint_id, record.quarantine_uri)
        )
    return tuple(keys)


def live_key(store: ObjectStore, record: CheckpointRecord) -> str | None:
    """Where a record's bytes are now: its quarantine copy when moved there, else its location
    (None: deleted, or outside this store)."""
    if record.state is CheckpointState.DELETED:
        return None
    return key_for_uri(store, record.quarantine_uri or record.uri)


def neighbours(
    store: ObjectStore, records: Iterable[CheckpointRecord], exclude: Iterable[str]
) -> list[Neighbour]:
    """The live bytes of ``records`` other than those in ``exclude`` (checkpoint ids)."""
    skip = set(exclude)
    return [
        Neighbour(r.checkpoint_id, key)
        for r in records
        if r.checkpoint_id not in skip and (key := live_key(store, r)) is not None
    ]


async def job_neighbours(
    store: ObjectStore, records: JobRecords, job_id: str, exclude: Iterable[str]
) -> list[Neighbour]:
    return neighbours(store, await records.by_job(job_id), exclude)


@dataclass(frozen=True)
class Removed:
    deleted: int
    """Objects deleted."""
    kept: int
    """Objects left in place because they belong to another live record."""
    notes: tuple[str, ...] = ()
    """What was kept and why (`Removal.note`), one per location that kept something."""


def _objects_at(store: ObjectStore, key: str) -> list[ObjectInfo]:
    """Every object at or under ``key``. A listing error propagates: an incomplete listing is
    never read as "absent"."""
    return [o for o in store.list(key) if contains(key, o.key)]


def remove(store: ObjectStore, removals: Sequence[Removal]) -> Removed:
    """Delete what each removal allows, then list again: what it allowed must really be gone
    (else `StorageUnavailable`, so the caller retries). Blocking I/O."""
    deleted = kept = 0
    for removal in removals:
        found = _objects_at(store, removal.key)
        doomed = [o for o in found if removal.removes(o.key)]
        kept += len(found) - len(doomed)
        for info in taking_apart(removal.key, doomed):  # never half a folder that looks new
            store.delete(info.key)
        deleted += len(doomed)
    left = [o.key for r in removals for o in _objects_at(store, r.key) if r.removes(o.key)]
    if left:
        raise StorageUnavailable(
            reason=f"{len(left)} object(s) still listed after delete", backend="removal"
        )
    notes = tuple(note for r in removals if (note := r.note()))
    return Removed(deleted, kept, notes)
