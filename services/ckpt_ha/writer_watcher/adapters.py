"""The watcher's I/O: a storage root read into observations, and its state kept in Redis.

This module owns the watcher's Redis key space (`state_key`, `state_keys`): nothing else formats
those keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.storage import ObjectInfo, ObjectStore, quarantine
from ckpt_ha.writer_watcher import changes, evidence
from ckpt_ha.writer_watcher.domain import Observation, Tracked, WatchState
from ckpt_ha.writer_watcher.ports import WatchStateStore, WatchStateUnavailable

SKIP_TOP = {quarantine.TOP}  # quarantined checkpoints' bytes, moved aside
log = logging.getLogger("ckpt_ha.writer_watcher")


Listed = dict[str, dict[str, ObjectInfo]]
"""A listing grouped by folder: ``<job>/<folder>`` → path in the folder → what was listed."""


def list_folders(store: ObjectStore, scope: Collection[str] | None = None) -> Listed:
    """The folders under the root that hold files (``scope`` None), or only those in ``scope``
    (``<job>/<folder>``, or ``<job>`` for all of a job's), each listed with one listing of its
    own prefix. Quarantined bytes (`SKIP_TOP`) are never listed."""
    groups: Listed = {}
    prefixes = [""] if scope is None else _prefixes(scope)
    for prefix in prefixes:
        for info in store.list(prefix):
            parts = info.key.split("/", 2)
            if len(parts) < 3 or parts[0] in SKIP_TOP:
                continue
            groups.setdefault(f"{parts[0]}/{parts[1]}", {})[parts[2]] = info
    return groups


def _prefixes(scope: Collection[str]) -> list[str]:
    jobs = {s for s in scope if "/" not in s}
    folders = {s for s in scope if "/" in s and s.split("/", 1)[0] not in jobs}
    return sorted(f"{s}/" for s in jobs | folders if s.split("/", 1)[0] not in SKIP_TOP)


def fingerprints(groups: Listed) -> dict[str, changes.Fingerprint]:
    """Each listed folder's `changes.fingerprint`."""
    return {
        folder: changes.fingerprint(
            (path, info.size, info.mtime, info.etag) for path, info in infos.items()
        )
        for folder, infos in groups.items()
    }


def observation(store: ObjectStore, folder: str, infos: Mapping[str, ObjectInfo]) -> Observation:
    """What ``folder`` holds (``infos``: its listing) with its commit evidence (`evidence.read`,
    the only part that reads objects)."""
    files = {path: info.size for path, info in infos.items()}
    return Observation(
        folder=folder,
        uri=store.uri(folder),
        files=files,
        first_written=min(i.mtime for i in infos.values()),
        last_written=max(i.mtime for i in infos.values()),
        evidence=evidence.read(store, folder, files),
    )


def scan(store: ObjectStore) -> Iterator[Observation]:
    """Every ``<job>/<folder>`` under the root that holds files, with its commit evidence
    (`evidence.read`)."""
    for folder, infos in sorted(list_folders(store).items()):
        yield observation(store, folder, infos)


def tracked_to_json(tracked: Tracked) -> str:
    return json.dumps(
        {
            "checkpoint_id": tracked.checkpoint_id,
            "first_seen": tracked.first_seen.isoformat(),
            "last_change": tracked.last_change.isoformat(),
            "signature": [list(item) for item in tracked.signature],
            "phase": tracked.phase,
            "uri": tracked.uri,
            "traceparent": tracked.traceparent,
            "failure": list(tracked.failure) if tracked.failure is not None else None,
            "step": tracked.step,
            "written": tracked.written.isoformat() if tracked.written is not None else None,
        },
        separators=(",", ":"),
    )


def tracked_from_json(raw: str | bytes) -> Tracked:
    doc = json.loads(raw)
    return Tracked(
        checkpoint_id=str(doc["checkpoint_id"]),
        first_seen=datetime.fromisoformat(doc["first_seen"]),
        last_change=datetime.fromisoformat(doc["last_change"]),
        signature=tuple((str(path), int(size)) for path, size in doc["signature"]),
        phase=str(doc["phase"]),
        uri=str(doc.get("uri", "")),
        traceparent=doc.get("traceparent") or None,
        failure=_failure(doc.get("failure")),
        step=_step(doc.get("step")),
        written=datetime.fromisoformat(doc["written"]) if doc.get("written") else None,
    )


def _step(value: object) -> int | None:
    """A stored step; None when absent (a state saved by an earlier release) or unreadable."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _failure(value: object) -> tuple[str, FailureSide] | None:
    """A stored failure; None when absent (a state saved by an earlier release) or unreadable."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    try:
        return str(value[0]), FailureSide(value[1])
    except ValueError:
        return None


def root_digest(root_uri: str) -> str:
    """A short name of the storage root at ``root_uri`` (its watch state, its scan's lease)."""
    return hashlib.sha256(root_uri.encode()).hexdigest()[:16]


def state_key(prefix: str, root_uri: str) -> str:
    """The hash holding the watch state of the storage root at ``root_uri``."""
    return f"{prefix}-watcher:{root_digest(root_uri)}"


def state_keys(prefix: str) -> str:
    """SCAN pattern for the watch state of every root under ``prefix`` (for cleanup)."""
    return f"{prefix}-watcher:*"


@asynccontextmanager
async def _available() -> AsyncIterator[None]:
    try:
        yield
    except RedisError as exc:
        raise WatchStateUnavailable(str(exc)) from exc


class RedisWatchState:
    """The watcher's per-folder tracking in one Redis hash, so a restart announces nothing twice
    (implements `ports.WatchStateStore`).

    Key `state_key`: one hash per watched root (two watchers on different roots can share a
    Redis), field = folder, value = the `Tracked` entry as JSON. Beside the registry's
    ``<prefix>:*`` keys, not among them: a registry rebuild clears those, and this state is not
    rebuilt from the event log. Only what changed since the last save is written.
    """

    def __init__(self, client: aioredis.Redis, prefix: str, root_uri: str) -> None:
        self.r = client
        self.key = state_key(prefix, root_uri)
        self._saved: dict[str, Tracked] = {}

    @classmethod
    def from_url(cls, where: str | RedisConfig, prefix: str, root_uri: str) -> RedisWatchState:
        return cls(connect(where), prefix, root_uri)

    async def close(self) -> None:
        await self.r.aclose()

    async def load(self) -> WatchState:
        async with _available():
            raw = await self.r.hgetall(self.key)
        folders: dict[str, Tracked] = {}
        for name, value in raw.items():
            folder = name.decode() if isinstance(name, bytes) else name
            try:
                folders[folder] = tracked_from_json(value)
            except (ValueError, KeyError, TypeError):
                log.warning("dropping unreadable watch state for %s", folder)
        self._saved = dict(folders)
        return WatchState(dict(folders))

    async def save(self, state: WatchState) -> None:
        """Write the entries that changed since the last load or save, delete the vanished."""
        changed: dict[Any, Any] = {
            folder: tracked_to_json(tracked)
            for folder, tracked in state.folders.items()
            if (saved := self._saved.get(folder)) is not tracked and saved != tracked
        }  # an unchanged entry is the same object: no field-by-field compare of every folder
        gone = [folder for folder in self._saved if folder not in state.folders]
        if not changed and not gone:
            return
        async with _available(), self.r.pipeline(transaction=True) as pipe:
            if changed:
                pipe.hset(self.key, mapping=changed)
            if gone:
                pipe.hdel(self.key, *gone)
            await pipe.execute()
        self._saved = dict(state.folders)


if TYPE_CHECKING:
    _implements: type[WatchStateStore] = RedisWatchState
