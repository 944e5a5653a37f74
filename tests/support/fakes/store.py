"""An in-memory object store: the fake of `ckpt_ha.storage.port.ObjectStore`.

`tests/support/store_contract.py` runs against it as against FsStore and S3Store, so a handler
test on this fake exercises the behaviour the real adapters promise. It validates keys, prefixes,
metadata, ranges and page sizes with the port's own functions (`validate_key` and friends), the
ones both adapters call, so what one of them rejects the fake rejects too, and before it touches
any object (a bad key is an `InvalidKey` even while the store is down, as with the adapters).

Where the two backends differ, the fake takes the stricter side, so a test on it does not pass
something that would fail on one of them:
- A key may not also be a "directory" of other keys (`a` and `a/b`): S3 allows it, a filesystem
  does not, and the port says to avoid it. The fake refuses it with the permanent `StorageError`
  FsStore raises.
- `move` is an atomic rename, like FsStore's: the object keeps its mtime and etag. (S3 copies,
  so there the moved object gets a new mtime.)

Test hooks: `clock` stamps every write's mtime (default: now, UTC; inject one to make checkpoint
ids, which hang on the oldest file's mtime, deterministic); `down = True` makes every storage
call raise `StorageUnavailable`, the transient error the adapters raise in an outage, including
reads from streams opened before. `uri` is pure and keeps working, as on the adapters.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import BinaryIO, Self

from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.storage.errors import (
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from ckpt_ha.storage.port import (
    ListPage,
    ObjectInfo,
    ObjectStore,
    ReadStream,
    validate_key,
    validate_metadata,
    validate_page_size,
    validate_prefix,
    validate_range,
)

BACKEND = "mem"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object as the fake holds it; replaced whole on every write, never changed in place."""

    data: bytes
    mtime: datetime
    etag: str
    metadata: Mapping[str, str] = field(default_factory=dict)

    def info(self, key: str, *, with_metadata: bool) -> ObjectInfo:
        return ObjectInfo(
            key=key,
            size=len(self.data),
            mtime=self.mtime,
            etag=self.etag,
            metadata=dict(self.metadata) if with_metadata else None,
        )


class _MemoryRange:
    """A range of one object's bytes (as they were when opened, like an open file after a
    replace); reads fail while the store is down."""

    def __init__(self, store: InMemoryStore, key: str, data: bytes) -> None:
        self._store = store
        self._key = key
        self._data = memoryview(data)
        self._pos = 0
        self._closed = False

    def read(self, size: int = -1, /) -> bytes:
        self._check()
        end = len(self._data) if size < 0 else min(len(self._data), self._pos + size)
        chunk = bytes(self._data[self._pos : end])
        self._pos += len(chunk)
        return chunk

    def readinto(self, buffer: memoryview, /) -> int:
        """Like `FsStore`'s streams, so checksumming takes the same path on both."""
        self._check()
        n = min(len(buffer), len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._closed = True

    def _check(self) -> None:
        if self._closed:
            raise ValueError("read from a closed stream")
        self._store._reachable(self._key)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class InMemoryStore(ObjectStore):
    """A flat dict of immutable `StoredObject`s behind one lock (services call stores from
    worker threads, and `put_if_absent` must have exactly one winner)."""

    def __init__(self, name: str = "store", *, clock: Clock = utc_now) -> None:
        if not name or "/" in name:
            raise ValueError(f"store name must be one non-empty path component, got {name!r}")
        self.name = name
        self.clock = clock
        """Stamps each write's mtime; may be swapped between writes."""
        self.down = False
        """Set to make every storage call raise `StorageUnavailable` (an outage)."""
        self.objects: dict[str, StoredObject] = {}
        """What the store holds, by key: to inspect, not to write (use `put`)."""
        self._lock = threading.RLock()
        self._versions = itertools.count(1)

    def __repr__(self) -> str:
        return f"InMemoryStore({self.name!r})"

    # --- listing --------------------------------------------------------------------------------

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        validate_page_size(page_size)
        self._reachable()
        return self._pages(prefix, start_after, page_size)

    def _pages(self, prefix: str, start_after: str | None, page_size: int) -> Iterator[ObjectInfo]:
        # Page by page like S3, so writes between pages and an outage mid-listing show.
        cursor = start_after
        while True:
            page = self.list_page(prefix, cursor=cursor, page_size=page_size)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def list_page(
        self, prefix: str = "", *, cursor: str | None = None, page_size: int = 1000
    ) -> ListPage:
        validate_prefix(prefix)
        validate_page_size(page_size)
        self._reachable()
        after = cursor or ""
        with self._lock:
            keys = sorted(k for k in self.objects if k.startswith(prefix) and k > after)
            items = tuple(
                self.objects[k].info(k, with_metadata=False) for k in keys[: page_size + 1]
            )
        if len(items) <= page_size:
            return ListPage(items=items, next_cursor=None)
        return ListPage(items=items[:page_size], next_cursor=items[page_size - 1].key)

    # --- reads ----------------------------------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo:
        return self._get(key).info(key, with_metadata=True)

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        validate_range(offset, length)
        data = self._get(key).data
        end = len(data) if length is None else offset + length
        return _MemoryRange(self, key, data[offset:end])

    # --- writes ---------------------------------------------------------------------------------

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return self._publish(key, data, metadata, create_only=False)

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return self._publish(key, data, metadata, create_only=True)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        if src_key == dst_key:
            raise InvalidKey(dst_key, reason="copy onto itself", backend=BACKEND)
        validate_key(src_key)
        validate_key(dst_key)
        with self._lock:
            source = self._get(src_key)
            self._require_no_conflict(dst_key)
            stored = self._new_version(source.data, source.metadata)
            self.objects[dst_key] = stored
        return stored.info(dst_key, with_metadata=True)

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        """A rename: one step under the lock, and the object keeps its mtime and etag."""
        if src_key == dst_key:
            raise InvalidKey(dst_key, reason="move onto itself", backend=BACKEND)
        validate_key(src_key)
        validate_key(dst_key)
        with self._lock:
            stored = self._get(src_key)
            self._require_no_conflict(dst_key)
            self.objects[dst_key] = stored
            del self.objects[src_key]
        return stored.info(dst_key, with_metadata=True)

    def delete(self, key: str) -> None:
        validate_key(key)
        self._reachable(key)
        with self._lock:
            self.objects.pop(key, None)

    def uri(self, key: str) -> str:
        return f"mem://{self.name}/{validate_key(key)}"

    # --- internals ------------------------------------------------------------------------------

    def _reachable(self, key: str | None = None) -> None:
        if self.down:
            raise StorageUnavailable(
                reason="the in-memory store is down (test)", backend=BACKEND, key=key
            )

    def _get(self, key: str) -> StoredObject:
        validate_key(key)
        self._reachable(key)
        with self._lock:
            stored = self.objects.get(key)
        if stored is None:
            raise ObjectNotFound(key, backend=BACKEND)
        return stored

    def _publish(
        self,
        key: str,
        data: bytes | BinaryIO,
        metadata: Mapping[str, str] | None,
        *,
        create_only: bool,
    ) -> ObjectInfo:
        validate_key(key)
        checked = validate_metadata(metadata, key=key)
        self._reachable(key)
        payload = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else _drain(data)
        with self._lock:
            if create_only and key in self.objects:
                raise ObjectExists(key, backend=BACKEND)
            self._require_no_conflict(key)
            stored = self._new_version(payload, checked)
            self.objects[key] = stored
        return stored.info(key, with_metadata=True)

    def _new_version(self, data: bytes, metadata: Mapping[str, str]) -> StoredObject:
        mtime = self.clock()
        if mtime.utcoffset() is None:
            raise ValueError(f"the store's clock must be timezone-aware, got {mtime!r}")
        etag = f"{BACKEND}-{next(self._versions):x}"
        return StoredObject(data, mtime.astimezone(UTC), etag, dict(metadata))

    def _require_no_conflict(self, key: str) -> None:
        """`a` and `a/b` cannot both be objects on a filesystem (see the module docstring)."""
        parts = key.split("/")
        ancestors = ("/".join(parts[:i]) for i in range(1, len(parts)))
        clash = next((a for a in ancestors if a in self.objects), None)
        if clash is None:
            below = key + "/"
            clash = next((k for k in self.objects if k.startswith(below)), None)
        if clash is not None:
            raise StorageError(
                reason=f"{clash!r} is an object, so {key!r} cannot be one too on a filesystem",
                key=key,
                backend=BACKEND,
            )


def _drain(stream: BinaryIO) -> bytes:
    """The rest of `stream`, from its current position."""
    chunks = []
    while chunk := stream.read(_READ_CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)
