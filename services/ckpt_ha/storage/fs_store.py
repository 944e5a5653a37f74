"""ObjectStore on a POSIX filesystem (local disk, NFS, a parallel-filesystem mount).

Writes follow the usual recipe: write a temp file in the target directory and fsync it, then
publish it with rename (`put`) or link (`put_if_absent`: link() fails with EEXIST atomically,
so exactly one racing writer wins), then fsync the directory so the entry survives a crash.

Metadata lives in a hidden sibling `.<name>.<version>.ckpt-meta.json`, where <version> is the data
file's (inode, size, mtime_ns). The sidecar is made durable before the data file is published and
`stat` only reads the sidecar naming the current version, so metadata becomes visible together
with its bytes and a stale sidecar can never describe other bytes. Sidecars rather than xattrs:
xattrs are missing or silently dropped on several filesystems and copy tools that checkpoints
meet, and one code path everywhere is easier to trust. `list` skips sidecars and temp files, and
keys that would collide with those names are rejected.

The root must already exist and is never created: a missing root is usually an unmounted
volume, and writing into the bare mountpoint would hide checkpoints, so it is reported as
StorageUnavailable. Symlinks are not followed while listing (a `latest` link is a pointer, not
an object), also not on the way to a listed prefix; a key whose resolved path leaves the root is
an InvalidKey.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import BinaryIO

from ckpt_ha.storage.errors import (
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from ckpt_ha.storage.fs_read import BACKEND, FileRange, os_errors, real_path, through_link
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

_TMP_PREFIX = ".ckpt-tmp-"
_META_SUFFIX = ".ckpt-meta.json"
_COPY_CHUNK = 1 << 20
_CREATE_ATTEMPTS = 3
_MISSING = (FileNotFoundError, NotADirectoryError)


def _is_reserved(name: str) -> bool:
    return name.startswith(_TMP_PREFIX) or (name.startswith(".") and name.endswith(_META_SUFFIX))


def _version(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def _info(key: str, st: os.stat_result, metadata: Mapping[str, str] | None) -> ObjectInfo:
    mtime = datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC)
    return ObjectInfo(key=key, size=st.st_size, mtime=mtime, etag=_version(st), metadata=metadata)


def _sidecar(path: Path, version: str) -> Path:
    return path.with_name(f".{path.name}.{version}{_META_SUFFIX}")


_batch = threading.local()
"""``folders``: the folders whose fsync `FsStore.folder_fsyncs_batched` defers on this thread."""


@contextlib.contextmanager
def _joined(folders: set[Path]) -> Iterator[None]:
    """This thread's writes join a batch another thread opened (`folder_fsyncs_batched`)."""
    previous = getattr(_batch, "folders", None)
    _batch.folders = folders  # set.add is atomic: threads of one batch share it
    try:
        yield
    finally:
        _batch.folders = previous


def fsync(path: Path) -> None:
    """Make a file, or a folder's entries, durable (nearly free when it already is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temp(directory: Path) -> tuple[int, Path]:
    tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for _ in range(_CREATE_ATTEMPTS - 1):
        # A concurrent delete may prune the then-empty directory between makedirs and open.
        with contextlib.suppress(FileNotFoundError):
            os.makedirs(directory, exist_ok=True)
            return os.open(tmp, flags, 0o666), tmp
    os.makedirs(directory, exist_ok=True)
    return os.open(tmp, flags, 0o666), tmp


class FsStore(ObjectStore):
    """ObjectStore rooted at an existing directory; see the module docstring for the layout."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._set_root(real_path(Path(root)))

    @classmethod
    def at_real_path(cls, root: Path) -> FsStore:
        """A store rooted at ``root``, which the caller just found to be its own real path
        (``real_path(root) == root``): not resolved a second time."""
        store = cls.__new__(cls)
        store._set_root(root)
        return store

    def _set_root(self, root: Path) -> None:
        self._root = root
        self._root_str = str(root).rstrip("/")  # "" for "/": keys are joined with "/"

    @functools.cached_property
    def uri_root(self) -> str:
        """What every key's `uri` starts with (computed once: `uri` resolves the path)."""
        return (self._root / "x").as_uri()[: -len("x")]

    def __repr__(self) -> str:
        return f"FsStore({str(self._root)!r})"

    @contextlib.contextmanager
    def folder_fsyncs_batched(self) -> Iterator[Callable[[], AbstractContextManager[None]]]:
        """Within it, this thread's `put` and `put_if_absent` make each object's bytes durable
        as usual but leave its folder's entry to one fsync of each folder on leaving (not on an
        error): many objects written into one folder cost one folder fsync, not one each.

        It gives ``join``: ``with join():`` on a helper thread puts that thread's writes into the
        same batch (leave it before the batch ends), so a writer using several threads still
        syncs each folder once."""
        outer: set[Path] | None = getattr(_batch, "folders", None)
        if outer is not None:
            yield functools.partial(_joined, outer)  # nested: the outer batch syncs
            return
        _batch.folders = folders = set[Path]()
        try:
            yield functools.partial(_joined, folders)
        finally:
            _batch.folders = None
        for folder in sorted(folders):
            with os_errors(str(folder)):
                fsync(folder)

    @property
    def root(self) -> Path:
        """The directory this store is rooted at (absolute)."""
        return self._root

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        # page_size only bounds S3 requests; a directory walk has nothing to page.
        validate_page_size(page_size)
        return self._walk(prefix, start_after or "")

    def list_page(
        self, prefix: str = "", *, cursor: str | None = None, page_size: int = 1000
    ) -> ListPage:
        validate_page_size(page_size)
        items = tuple(itertools.islice(self._walk(prefix, cursor or ""), page_size + 1))
        if len(items) <= page_size:
            return ListPage(items=items, next_cursor=None)
        return ListPage(items=items[:page_size], next_cursor=items[page_size - 1].key)

    def stat(self, key: str) -> ObjectInfo:
        path = self._checked(key)
        with os_errors(key):
            try:
                st = os.stat(path)
            except _MISSING:
                raise self._not_found(key) from None
            if not S_ISREG(st.st_mode):
                raise self._not_found(key)
            return _info(key, st, self._read_metadata(path, _version(st), key))

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        validate_range(offset, length)
        path = self._checked(key)
        with os_errors(key):
            try:
                file = open(path, "rb")  # noqa: SIM115 - closed by the stream it is returned in
            except (*_MISSING, IsADirectoryError):
                raise self._not_found(key) from None
            try:
                if offset:
                    file.seek(offset)
            except BaseException:
                file.close()
                raise
        return FileRange(file, key, length)

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
        src = self._path(src_key)
        self._path(dst_key)
        with os_errors(src_key):
            try:
                source = src.open("rb")
            except (*_MISSING, IsADirectoryError):
                raise self._not_found(src_key) from None
            with source:
                version = _version(os.fstat(source.fileno()))
                metadata = self._read_metadata(src, version, src_key)
                return self._publish(dst_key, source, metadata, create_only=False)

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        """rename(2): the bytes never travel. The sidecar is linked to its new name before the
        data moves and unlinked after, so the moved object is never seen without its metadata
        (rename keeps inode, size and mtime, hence the version the sidecar is named after)."""
        if src_key == dst_key:
            raise InvalidKey(dst_key, reason="move onto itself", backend=BACKEND)
        src = self._path(src_key)
        dst = self._path(dst_key)
        with os_errors(src_key):
            try:
                st = os.stat(src)
            except _MISSING:
                raise self._not_found(src_key) from None
            if not S_ISREG(st.st_mode):
                raise self._not_found(src_key)
            version = _version(st)
            metadata = self._read_metadata(src, version, src_key)
            try:
                return self._rename(src, dst, src_key, dst_key, st, metadata)
            except OSError as err:
                if err.errno != errno.EXDEV:
                    raise
        return super().move(src_key, dst_key)  # another filesystem mounted inside the root

    def _rename(
        self, src: Path, dst: Path, src_key: str, dst_key: str, st: os.stat_result,
        metadata: dict[str, str],
    ) -> ObjectInfo:  # fmt: skip
        version = _version(st)
        for attempt in range(_CREATE_ATTEMPTS):
            os.makedirs(dst.parent, exist_ok=True)
            try:
                previous = self._current_version(dst)
                if metadata:
                    _sidecar(dst, version).unlink(missing_ok=True)
                    os.link(_sidecar(src, version), _sidecar(dst, version))
                os.replace(src, dst)
                break
            except FileNotFoundError:
                if not src.exists():  # moved or deleted by someone else meanwhile
                    raise self._not_found(src_key) from None
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
                # else a concurrent delete pruned the new, empty directory: make it again
        _sidecar(src, version).unlink(missing_ok=True)
        if previous is not None and previous != version:
            _sidecar(dst, previous).unlink(missing_ok=True)
        fsync(dst.parent)
        with contextlib.suppress(FileNotFoundError):  # pruned meanwhile: nothing to sync
            fsync(src.parent)
        self._prune_empty_dirs(src.parent)
        return _info(dst_key, st, metadata)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with os_errors(key):
            try:
                st = os.lstat(path)
            except _MISSING:
                self._require_root()
                return
            if S_ISDIR(st.st_mode):
                return  # a directory is not an object: nothing to delete
            path.unlink(missing_ok=True)
            if S_ISREG(st.st_mode):
                _sidecar(path, _version(st)).unlink(missing_ok=True)
            fsync(path.parent)
            self._prune_empty_dirs(path.parent)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def _path(self, key: str) -> Path:
        self._checked(key)
        return self._root / key

    def _checked(self, key: str) -> str:
        """The file path of a valid ``key`` that resolves inside the root (`_path` as a str)."""
        validate_key(key)
        if any(_is_reserved(part) for part in key.split("/")):
            raise InvalidKey(key, reason="name reserved for temp/metadata files", backend=BACKEND)
        self._require_inside(key, key)
        return f"{self._root_str}/{key}"

    def _require_inside(self, relative: str, key: str) -> None:
        """The root joined with ``relative`` (validated like a key: no empty, '.' or '..'
        parts) must resolve inside the root, else `InvalidKey` for ``key``. Checked on every
        call, all the way from '/': any component may have become a link since the last call
        (the root's own included, when it is a checkpoint folder a job writes:
        `formats.paths.confine`); inside `fs_read.ancestors_checked_once` (one verification of
        a checkpoint folder) the folders above that folder are looked up once for the block."""
        if not through_link(f"{self._root_str}/{relative}"):
            return  # its own real path, and it starts with the root
        try:
            real = (self._root / relative).resolve()
        except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop, before 3.13
            raise InvalidKey(key, reason=f"cannot resolve: {err}", backend=BACKEND) from err
        if not real.is_relative_to(self._root):
            raise InvalidKey(key, reason="resolves outside the store root", backend=BACKEND)

    def _require_root(self) -> None:
        if not self._root.is_dir():
            raise StorageUnavailable(
                reason=f"root {self._root} is missing (volume not mounted?)", backend=BACKEND
            )

    def _not_found(self, key: str) -> StorageError:
        self._require_root()
        return ObjectNotFound(key, backend=BACKEND)

    def _read_metadata(self, path: str | Path, version: str, key: str) -> dict[str, str]:
        directory, _, name = os.fspath(path).rpartition("/")
        try:  # the sidecar `_sidecar` names, without pathlib (on every `stat`)
            with open(f"{directory}/.{name}.{version}{_META_SUFFIX}", "rb") as sidecar:
                raw = sidecar.read()
        except FileNotFoundError:
            return {}
        try:
            return {str(name): str(value) for name, value in json.loads(raw).items()}
        except (ValueError, AttributeError) as err:
            raise StorageError(reason="corrupt metadata sidecar", key=key, backend=BACKEND) from err

    def _publish(
        self,
        key: str,
        data: bytes | BinaryIO,
        metadata: Mapping[str, str] | None,
        *,
        create_only: bool,
    ) -> ObjectInfo:
        path = self._path(key)
        checked = validate_metadata(metadata, key=key)
        self._require_root()
        with os_errors(key):
            fd, tmp = _create_temp(path.parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    if isinstance(data, bytes):
                        out.write(data)
                    else:
                        shutil.copyfileobj(data, out, _COPY_CHUNK)
                    out.flush()
                    os.fsync(out.fileno())
                    st = os.fstat(out.fileno())
                version = _version(st)  # rename and link keep inode, size and mtime
                if checked:
                    self._write_sidecar(path, version, checked)
                previous = None if create_only else self._current_version(path)
                try:
                    if create_only:
                        os.link(tmp, path)  # unlike rename, fails if the target exists
                    else:
                        os.replace(tmp, path)
                except BaseException as err:
                    _sidecar(path, version).unlink(missing_ok=True)  # nothing points at it
                    if isinstance(err, FileExistsError):
                        raise ObjectExists(key, backend=BACKEND) from None
                    raise
            finally:
                tmp.unlink(missing_ok=True)
            batched: set[Path] | None = getattr(_batch, "folders", None)
            if batched is None:
                fsync(path.parent)
            else:
                batched.add(path.parent)  # synced once when the batch ends
            if previous is not None and previous != version:
                _sidecar(path, previous).unlink(missing_ok=True)
        return _info(key, st, checked)

    def _write_sidecar(self, path: Path, version: str, metadata: Mapping[str, str]) -> None:
        # The name is unique to the unpublished temp file, so nobody can read it half-written;
        # it must be durable before the data that points at it is published.
        with _sidecar(path, version).open("wb") as out:
            out.write(json.dumps(metadata, sort_keys=True).encode())
            out.flush()
            os.fsync(out.fileno())
        fsync(path.parent)

    @staticmethod
    def _current_version(path: Path) -> str | None:
        try:
            st = os.lstat(path)
        except _MISSING:
            return None
        return _version(st) if S_ISREG(st.st_mode) else None

    def _prune_empty_dirs(self, directory: Path) -> None:
        # Only empty directories go; _create_temp retries if it loses a race with this.
        while directory != self._root:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def _walk(self, prefix: str, after: str) -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        start = prefix.rpartition("/")[0]
        if start:
            self._require_inside(start, prefix)
        self._require_root()
        if start and real_path(self._root / start) != self._root / start:
            # Reached through a symlink: not followed here either, as in a walk from the root
            # (listing, then moving or deleting, "a/" must never reach another folder's files).
            return iter(())
        return self._walk_dir(start, prefix, after)

    def _walk_dir(self, directory: str, prefix: str, after: str) -> Iterator[ObjectInfo]:
        """Yield objects under `directory` whose key starts with `prefix` and sorts after
        `after`, in key order. A subdirectory `d` holds exactly the keys starting "d/", so
        sorting it as "d/" among the file names makes the walk come out in global key order,
        and lets whole subtrees outside the prefix or before `after` be skipped."""
        with os_errors(directory or None):
            try:
                with os.scandir(self._root / directory) as scan:
                    entries = [e for e in scan if not e.is_symlink() and not _is_reserved(e.name)]
            except _MISSING:
                return
            named = sorted(
                ((e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in entries),
                key=itemgetter(0),
            )
        for name, entry in named:
            key = f"{directory}/{name}" if directory else name
            if name.endswith("/"):
                wanted = key.startswith(prefix) or prefix.startswith(key)
                if wanted and (after < key or after.startswith(key)):
                    yield from self._walk_dir(key[:-1], prefix, after)
            elif key.startswith(prefix) and key > after:
                with os_errors(key):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # deleted while we walked
                if S_ISREG(st.st_mode):
                    yield _info(key, st, None)
