"""The object-store port: what services may assume about checkpoint storage, on any backend.

Keys are '/'-separated paths relative to the store root, compared as plain strings. The rules
(`validate_key`) are the intersection of what S3 and a POSIX filesystem can both hold, so that a
key written through one backend means the same object on the other. The API is synchronous:
services call it through `ckpt_ha.storage.bounded.call` (on a worker thread, waited for at most
a bound), which keeps blocking I/O off the event loop without a second, async copy of every
backend.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import BinaryIO, Protocol, Self

from ckpt_ha.storage.errors import InvalidKey, InvalidMetadata, ObjectNotFound

MAX_KEY_BYTES = 1024  # S3's limit; the FS backend keeps it too so keys stay portable
MAX_METADATA_BYTES = 2048  # S3's limit on user metadata (keys plus values)
CREATE_ID_METADATA = "ckpt-ha-create-id"
"""Reserved metadata name: the S3 backend tags create-only puts with it to recognise its own
write after a lost answer (s3_store.py). No backend accepts it from callers."""
_METADATA_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object as the backend reports it.

    `mtime` is timezone-aware UTC. `etag` is an opaque change token: equal values mean the same
    stored version, it is not promised to be a content hash. `metadata` is None when the call did
    not fetch it (`list` never does; S3 listings do not carry it) and a dict otherwise.
    """

    key: str
    size: int
    mtime: datetime
    etag: str | None
    metadata: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing; `next_cursor` is None on the last page and only there."""

    items: tuple[ObjectInfo, ...]
    next_cursor: str | None


class ReadStream(Protocol):
    """A forward-only reader over (a range of) one object. Close it, or use it as a context."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


class ObjectStore(Protocol):
    """A flat namespace of blobs under one root (a directory, or a bucket and key prefix).

    Invariants every backend keeps (tests/support/store_contract.py proves them on each):
    - A reader sees either the old or the new object, never a partial write: `put` publishes
      atomically, and an object's metadata is published together with its bytes.
    - `put_if_absent` is create-only and atomic: of two racing writers exactly one succeeds, the
      other gets `ObjectExists`. This is how checkpoint manifests are claimed exactly once.
    - Listings are in lexicographic key order (code points, which equals S3's UTF-8 byte order).
      The cursor is simply the last key seen, so it can be persisted and a listing resumed after
      a restart, on either backend. A page may hold fewer than `page_size` items.
    - `delete` is idempotent; missing objects raise `ObjectNotFound` everywhere else.
    - Failures are `StorageError`s; `transient=True` (`StorageUnavailable`) means "retry later".

    One layout is not portable: S3 lets `a` and `a/b` both be objects, a filesystem cannot (the
    second write fails permanently there). Keep a key from also being a "directory" of others.
    """

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (a plain string prefix, not a directory),
        after `start_after`, in key order; fetched `page_size` at a time underneath."""
        ...

    def list_page(
        self, prefix: str = "", *, cursor: str | None = None, page_size: int = 1000
    ) -> ListPage:
        """One page of `list(prefix, start_after=cursor)`."""
        ...

    def stat(self, key: str) -> ObjectInfo:
        """Size, mtime, etag and metadata of `key`; raises ObjectNotFound."""
        ...

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        """Stream `length` bytes (all remaining if None) from `offset`. A range running past the
        end is cut short there, like a file read; it is not an error."""
        ...

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        """Create or replace `key` atomically; `metadata` replaces the old metadata entirely.
        A file is read from its current position and should be seekable (S3 may rewind it to
        retry)."""
        ...

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        """Create `key` only if it does not exist; otherwise raise ObjectExists, untouched."""
        ...

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Copy bytes and metadata to `dst_key` (replacing it); the source stays."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key`; removing a missing key is a no-op so retries are safe."""
        ...

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Move bytes and metadata to `dst_key` (replacing it); afterwards `src_key` is gone.

        Readers of `dst_key` see the old or the moved object, never a mix. Not atomic as a whole
        on every backend: this default copies then deletes (S3 has no rename), so a crash in
        between leaves both, and repeating the move finishes it. Backends with a real rename
        override it."""
        info = self.copy(src_key, dst_key)
        self.delete(src_key)
        return info

    def uri(self, key: str) -> str:
        """Where `key` lives, for logs and events: `file:///abs/path` or `s3://bucket/key`."""
        ...

    def read_bytes(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        """`open_read` drained into memory; for manifests and headers, not whole shards."""
        with self.open_read(key, offset=offset, length=length) as stream:
            return stream.read()

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    def quarantine(self, key: str, prefix: str = "quarantine/") -> str:
        """Copy `key` to `prefix + key` and return the new key. The original is left in place:
        the caller deletes it once the quarantine is recorded, so a crash in between loses
        nothing and a retry is harmless."""
        target = validate_key(prefix + key)
        self.copy(key, target)
        return target


def validate_key(key: str) -> str:
    """Return `key` if it is a valid object key, else raise InvalidKey.

    Rejected: empty keys, a leading '/', empty, '.' or '..' components (so no key can climb out
    of the root or alias another key), control characters and keys over 1024 UTF-8 bytes.
    """
    if not key:
        raise InvalidKey(key, reason="key is empty")
    if key.startswith("/"):
        raise InvalidKey(key, reason="key must be relative (no leading '/')")
    if _CONTROL.search(key):
        raise InvalidKey(key, reason="key contains a control character")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidKey(key, reason="key has an empty, '.' or '..' component")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidKey(key, reason=f"key is longer than {MAX_KEY_BYTES} bytes")
    return key


def validate_prefix(prefix: str) -> str:
    """Like `validate_key`, but "" and a trailing '/' or partial last component are allowed."""
    if not prefix:
        return prefix
    if prefix.startswith("/"):
        raise InvalidKey(prefix, reason="prefix must be relative (no leading '/')")
    if _CONTROL.search(prefix):
        raise InvalidKey(prefix, reason="prefix contains a control character")
    *dirs, last = prefix.split("/")
    if any(part in ("", ".", "..") for part in dirs) or last in (".", ".."):
        raise InvalidKey(prefix, reason="prefix has an empty, '.' or '..' component")
    return prefix


def validate_metadata(metadata: Mapping[str, str] | None, *, key: str) -> dict[str, str]:
    """Return a copy of `metadata` if S3 would round-trip it unchanged, else raise.

    S3 sends metadata as HTTP headers: names are lower-cased, values must be ASCII and lose
    surrounding whitespace, and the total is capped at 2 KiB. Enforcing that on the FS backend
    too keeps the two interchangeable.
    """
    checked = dict(metadata or {})
    if CREATE_ID_METADATA in checked:
        raise InvalidMetadata(key=key, reason=f"name {CREATE_ID_METADATA!r} is reserved")
    for name, value in checked.items():
        if not _METADATA_NAME.fullmatch(name):
            raise InvalidMetadata(key=key, reason=f"name {name!r} is not [a-z0-9-]+")
        if not (value.isascii() and value.isprintable() and value == value.strip()):
            raise InvalidMetadata(key=key, reason=f"value of {name!r} is not trimmed ASCII")
    size = sum(len(name) + len(value) for name, value in checked.items())
    if size > MAX_METADATA_BYTES:
        raise InvalidMetadata(key=key, reason=f"{size} bytes is over {MAX_METADATA_BYTES}")
    return checked


def validate_range(offset: int, length: int | None) -> None:
    """Negative offsets or lengths are caller bugs, not storage failures: ValueError."""
    if offset < 0 or (length is not None and length < 0):
        raise ValueError(f"invalid byte range: offset={offset}, length={length}")


def validate_page_size(page_size: int) -> None:
    if page_size < 1:
        raise ValueError(f"page_size must be positive, got {page_size}")
