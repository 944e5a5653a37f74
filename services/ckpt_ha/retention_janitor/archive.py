"""The cold archive of tombstones (R6): deleted checkpoints' records moved out of Redis.

A deleted checkpoint's record is its tombstone (id, URI, checksums, reason, actor, time, its
whole history). The hot index (the registry in Redis) keeps it for
``CKPT_HA_TOMBSTONE_HOT_DAYS``; then the janitor's round writes it here and only after that
removes it from Redis (`ckpt_ha.registry.redis_registry.Registry.forget_tombstones`), so a crash
between the two leaves it in both places, never in neither. Writing the same tombstone again is
harmless (same key, same document). ``ckpt-ha retention audit`` reads it like the registry.

Layout, in an object store of its own (``CKPT_HA_TOMBSTONE_ARCHIVE``, never under the
checkpoints' storage root, whose unknown objects reconcile would report), ids percent-encoded:

* ``jobs/<job>/<checkpoint>.json``  the record as JSON (`CheckpointRecord`): a job's tombstones
  are one listing away;
* ``checkpoints/<checkpoint>``      the job id: one checkpoint's tombstone is two reads away.

The record is written before its pointer, so a pointer always finds its record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.storage import FsStore, ObjectNotFound, bounded, open_store
from ckpt_ha.storage.port import ObjectStore

JOBS = "jobs/"
CHECKPOINTS = "checkpoints/"


def _part(name: str) -> str:
    """One key component for an id: percent-encoded ('/' too), never '.' or '..'."""
    part = quote(name, safe="")
    return part.replace(".", "%2E") if part in (".", "..") else part


def record_key(job_id: str, checkpoint_id: str) -> str:
    return f"{JOBS}{_part(job_id)}/{_part(checkpoint_id)}.json"


def pointer_key(checkpoint_id: str) -> str:
    return f"{CHECKPOINTS}{_part(checkpoint_id)}"


def open_archive(where: str, *, create: bool) -> StoreArchive | None:
    """The archive at ``where`` (``CKPT_HA_TOMBSTONE_ARCHIVE``). A directory that does not exist
    yet is created by the janitor (``create``: it writes the archive) before its first
    tombstone, and means nothing archived yet to a reader (None)."""
    store = open_store(where)
    if isinstance(store, FsStore) and not store.root.is_dir():
        if not create:
            return None
        return StoreArchive(store, make=store.root)  # made by the first tombstone it keeps
    return StoreArchive(store)


class StoreArchive:
    """`TombstoneArchive` on an `ObjectStore` (the filesystem or S3 backends, or the fake)."""

    def __init__(self, store: ObjectStore, *, make: Path | None = None) -> None:
        self.store = store
        self._make = make
        """A directory to create before the first write (a filesystem archive not made yet)."""

    async def put(self, records: Sequence[CheckpointRecord]) -> None:
        """Write each tombstone (record first, then its pointer), several at once on the
        storage workers; returns once all are stored, or raises the first failure."""

        if self._make is not None and records:
            self._make.mkdir(parents=True, exist_ok=True)
            self._make = None

        async def one(r: CheckpointRecord) -> None:
            doc = r.model_dump_json().encode()
            await bounded.call(self.store.put, record_key(r.job_id, r.checkpoint_id), doc)
            await bounded.call(self.store.put, pointer_key(r.checkpoint_id), r.job_id.encode())

        await asyncio.gather(*(one(r) for r in records))

    def _read(self, key: str) -> bytes:
        with self.store.open_read(key) as stream:
            return stream.read()

    async def _record(self, key: str) -> CheckpointRecord | None:
        try:
            raw = await bounded.call(self._read, key)
        except ObjectNotFound:
            return None
        return CheckpointRecord.model_validate_json(raw)

    def _unmade(self) -> bool:
        """Not created yet: nothing archived (a read would take it for an unmounted volume)."""
        return self._make is not None and not self._make.is_dir()

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        """One archived tombstone (None: not archived)."""
        if self._unmade():
            return None
        try:
            job = (await bounded.call(self._read, pointer_key(checkpoint_id))).decode()
        except ObjectNotFound:
            return None
        return await self._record(record_key(job, checkpoint_id))

    async def _under(self, prefix: str) -> list[CheckpointRecord]:
        if self._unmade():
            return []
        keys = await bounded.call(lambda: [o.key for o in self.store.list(prefix)])
        found = [await self._record(k) for k in keys if k.endswith(".json")]
        return [r for r in found if r is not None]

    async def by_job(self, job_id: str) -> list[CheckpointRecord]:
        """A job's archived tombstones, by checkpoint id."""
        return sorted(await self._under(f"{JOBS}{_part(job_id)}/"), key=_by_id)

    async def everything(self) -> list[CheckpointRecord]:
        """Every archived tombstone, by checkpoint id (reads the whole archive)."""
        return sorted(await self._under(JOBS), key=_by_id)


def _by_id(record: CheckpointRecord) -> str:
    return record.checkpoint_id
