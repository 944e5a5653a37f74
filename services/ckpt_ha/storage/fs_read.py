"""The filesystem store's reads, errors and paths: an OSError mapped to a StorageError, a byte
range of an open file as a `ReadStream`, a path's real path cheaply (`FsStore`, the formats)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from pathlib import Path
from stat import S_ISLNK
from types import TracebackType
from typing import BinaryIO, Self

from ckpt_ha.storage import leased_map
from ckpt_ha.storage.errors import InvalidKey, StorageError, StorageUnavailable

BACKEND = "fs"
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EBUSY,
        errno.EDQUOT,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.EINTR,
        errno.EIO,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.ENOLCK,
        errno.ENOSPC,
        errno.ENOTCONN,
        errno.ESTALE,
        errno.ETIMEDOUT,
    }
)


def classify_os_error(err: OSError, key: str | None = None) -> StorageError:
    """The StorageError for an OSError that is a failure rather than an answer (unlike ENOENT
    on a read, which means ObjectNotFound): I/O, space and network-filesystem errors are
    transient, the rest (permissions, read-only filesystem, path conflicts) permanent."""
    if err.errno == errno.ENAMETOOLONG:
        return InvalidKey(key or "", reason="name too long for the filesystem", backend=BACKEND)
    if err.errno in _TRANSIENT_ERRNOS:
        return StorageUnavailable(reason=str(err), backend=BACKEND, key=key)
    return StorageError(reason=str(err), backend=BACKEND, key=key)


@contextlib.contextmanager
def os_errors(key: str | None) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        raise classify_os_error(err, key) from err


class FileRange:
    """At most `remaining` bytes of an open file, with I/O errors mapped like the store's."""

    def __init__(self, file: BinaryIO, key: str, remaining: int | None) -> None:
        self._file = file
        self._key = key
        self._remaining = remaining

    def read(self, size: int = -1, /) -> bytes:
        if self._remaining is not None:
            size = self._remaining if size < 0 else min(size, self._remaining)
        with os_errors(self._key):
            chunk = self._file.read(size)
        if self._remaining is not None:
            self._remaining -= len(chunk)
        return chunk

    def readinto(self, buffer: memoryview, /) -> int:
        """Fill ``buffer`` without allocating: the fast path for checksumming whole shards."""
        if self._remaining is not None:
            buffer = buffer[: self._remaining]
        with os_errors(self._key):
            n = self._file.readinto(buffer)  # type: ignore[attr-defined]
        if self._remaining is not None:
            self._remaining -= n
        return int(n)

    def leased_path(self) -> AbstractContextManager[str | None]:
        """The whole file as a path for a reader that maps it itself, while a read lease
        holds it and it is all in the page cache, else None (`leased_map.leased_whole`)."""
        return leased_map.leased_whole(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def real_path(path: Path) -> Path:
    """``path.resolve()``, cheaply when there is nothing to resolve.

    An absolute path without '..' components and without a symbolic link on the way is its
    own real path: that takes one ``lstat`` per component. Anything else (a link anywhere, a
    relative path, '..') goes through ``Path.resolve`` as before, with its errors.
    """
    if path.is_absolute() and ".." not in path.parts and not through_link(str(path)):
        return path
    return path.resolve()


_checked_above: ContextVar[str | None] = ContextVar("fs_checked_above", default=None)


@contextlib.contextmanager
def ancestors_checked_once(folder: str) -> Iterator[None]:
    """Within the block, `through_link` of a path inside ``folder`` (absolute, normalised)
    looks up only ``folder`` itself and what lies below it: the folders above it are looked
    up once, here, and trusted for the block (when none of them is a link; else every walk
    goes from '/' as usual). For one verification of a checkpoint folder: its parents (the
    storage root and above) are not what a job writes, the folder and its files are, and
    those are still looked up on every call. Threads get it through
    `contextvars.copy_context`."""
    parent = folder.rstrip("/").rpartition("/")[0]
    trusted = parent if parent and not through_link(parent) and os.path.isdir(parent) else None
    token = _checked_above.set(trusted)
    try:
        yield
    finally:
        _checked_above.reset(token)


def through_link(path: str) -> bool:
    """Whether a component of the absolute, normalised ``path`` (its last one included) is a
    symbolic link. Like ``os.path.realpath``, a component that cannot be looked up counts as
    no link; nothing below it can be looked up either, so the walk ends there. Inside an
    `ancestors_checked_once` block the walk starts below the folders it checked."""
    current = ""
    trusted = _checked_above.get()
    if trusted is not None and path.startswith(f"{trusted}/"):
        current, path = trusted, path[len(trusted) :]
    for part in path.split("/")[1:]:
        if not part:  # the root directory itself ("/")
            continue
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            return False
        if S_ISLNK(mode):
            return True
    return False
