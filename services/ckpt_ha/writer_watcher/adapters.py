"""The watcher's I/O: a storage root read into observations, and its state kept in Redis.

This module owns the watcher's Redis key space (`state_key`, `state_keys`): nothing else formats
those keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError

from ckpt_ha.contracts.checkpoint import CheckpointFormat, CheckpointIdentity
from ckpt_ha.formats import dcp, dcp_metadata, detect, native
from ckpt_ha.formats.paths import inside
from ckpt_ha.formats.safetensors import INDEX_SUFFIX
from ckpt_ha.registry.client import connect
from ckpt_ha.storage import ObjectInfo, ObjectStore, StorageError, quarantine
from ckpt_ha.writer_watcher.domain import Evidence, Observation, Tracked, WatchState
from ckpt_ha.writer_watcher.ports import WatchStateStore, WatchStateUnavailable

SKIP_TOP = {quarantine.TOP}  # quarantined checkpoints' bytes, moved aside
log = logging.getLogger("ckpt_ha.writer_watcher")
MAX_MARKER_BYTES = 16 * 1024 * 1024


def scan(store: ObjectStore) -> Iterator[Observation]:
    """Every ``<job>/<folder>`` under the root that holds files, with its commit evidence."""
    groups: dict[str, dict[str, ObjectInfo]] = {}
    for info in store.list(""):
        parts = info.key.split("/", 2)
        if len(parts) < 3 or parts[0] in SKIP_TOP:
            continue
        groups.setdefault(f"{parts[0]}/{parts[1]}", {})[parts[2]] = info
    for folder, infos in sorted(groups.items()):
        files = {path: info.size for path, info in infos.items()}
        yield Observation(
            folder=folder,
            uri=store.uri(folder),
            files=files,
            first_written=min(i.mtime for i in infos.values()),
            last_written=max(i.mtime for i in infos.values()),
            evidence=evidence(store, folder, files),
        )


def _read_json(store: ObjectStore, key: str, size: int) -> object:
    if size > MAX_MARKER_BYTES:
        return None
    try:
        return json.loads(store.read_bytes(key))
    except (StorageError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def _identity(doc: object) -> CheckpointIdentity | None:
    """The manifest's identity block if it is a valid one; verification judges the rest."""
    if not isinstance(doc, dict):
        return None
    try:
        return CheckpointIdentity.model_validate(doc)
    except ValidationError:
        return None


def evidence(store: ObjectStore, folder: str, files: Mapping[str, int]) -> Evidence:
    """What must exist for this folder to count as committed, per its format."""
    top = {p.split("/", 1)[0] for p in files}
    fmt = detect(top)
    if fmt is CheckpointFormat.NATIVE:
        doc = _read_json(store, f"{folder}/{native.MANIFEST}", files[native.MANIFEST])
        shards = doc.get("shards") if isinstance(doc, dict) else None
        if not isinstance(shards, list):
            # A manifest that cannot be read is still the commit marker: verification judges it.
            return Evidence(fmt, {native.MANIFEST: files[native.MANIFEST]})
        required = {native.MANIFEST: files[native.MANIFEST]}
        for shard in shards:
            path = inside(shard.get("path")) if isinstance(shard, dict) else None
            size = shard.get("size") if isinstance(shard, dict) else None
            if path is not None and isinstance(size, int):
                required[path] = size
        step = doc.get("step") if isinstance(doc, dict) else None
        identity = doc.get("identity") if isinstance(doc, dict) else None
        run_id = identity.get("run_id") if isinstance(identity, dict) else None
        return Evidence(
            fmt,
            required,
            step=step if isinstance(step, int) else None,
            run_id=run_id if isinstance(run_id, str) else None,
            identity=_identity(identity),
        )
    if fmt is CheckpointFormat.SAFETENSORS:
        indexes = [p for p in files if p.endswith(INDEX_SUFFIX)]
        if indexes:
            doc = _read_json(store, f"{folder}/{indexes[0]}", files[indexes[0]])
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
            required = {indexes[0]: files[indexes[0]]}
            required.update({s: files.get(s, -1) for s in shards if isinstance(s, str)})
            return Evidence(fmt, required)
        return Evidence(fmt, dict(files))
    if fmt is CheckpointFormat.HF_TRAINER:
        doc = _read_json(store, f"{folder}/trainer_state.json", files["trainer_state.json"])
        step = doc.get("global_step") if isinstance(doc, dict) else None
        return Evidence(fmt, dict(files), step=step if isinstance(step, int) else None)
    if fmt is CheckpointFormat.TORCH_DCP and dcp.METADATA in files:
        return _dcp_evidence(store, folder, files)
    return Evidence(fmt, None)


def _dcp_evidence(store: ObjectStore, folder: str, files: Mapping[str, int]) -> Evidence:
    """``.metadata`` plus every data file its storage entries name, each at least as long as
    the furthest entry in it (DCP records offset+length, not file sizes)."""
    marker = {dcp.METADATA: files[dcp.METADATA]}
    fmt = CheckpointFormat.TORCH_DCP
    if files[dcp.METADATA] > dcp_metadata.MAX_METADATA_BYTES:
        return Evidence(fmt, marker)
    try:
        metadata = dcp_metadata.parse(store.read_bytes(f"{folder}/{dcp.METADATA}"))
    except (StorageError, dcp_metadata.UnsafeMetadata, dcp_metadata.MalformedMetadata):
        # An unreadable or hostile .metadata is still the commit marker: verification judges it.
        return Evidence(fmt, marker)
    needed = metadata.needed_sizes(inside)
    step = None
    if all(files.get(path, -1) >= size for path, size in needed.items()):
        # Only once the data is all there: the step may live in a data file.
        try:
            step, _ = dcp.recorded_step(store, folder, metadata)
        except StorageError:
            step = None
    return Evidence(fmt, {**needed, **marker}, step=step, at_least=frozenset(needed))


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
    )


def state_key(prefix: str, root_uri: str) -> str:
    """The hash holding the watch state of the storage root at ``root_uri``."""
    digest = hashlib.sha256(root_uri.encode()).hexdigest()[:16]
    return f"{prefix}-watcher:{digest}"


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
    def from_url(cls, url: str, prefix: str, root_uri: str) -> RedisWatchState:
        return cls(connect(url), prefix, root_uri)

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
            if self._saved.get(folder) != tracked
        }
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
