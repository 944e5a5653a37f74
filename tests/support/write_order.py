"""The order in which a real library writes a checkpoint's files, and a slow replay of it.

Recorded, not assumed: while the library writes into folders watched with inotify (Linux), the
kernel queues, in order, each file's close after writing, each rename with its source name and
each new name made by link(2). A file's place in the order is its last such event: when it
became complete under its final name. A store-level writer (the native SDK) is recorded by the
store itself (`RecordingStore`).

The replay writes the same bytes into another folder in that order, each file in chunks (a
renamed or linked file under its temporary name first, then renamed), calling back after every
chunk: a slow writer a watcher can be run against at every intermediate state.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

from ckpt_ha.storage import FsStore, ObjectInfo

IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_Q_OVERFLOW = 0x4000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
_EVENT = struct.Struct("iIII")
HIDDEN_TEMP = ".ckpt-tmp-replay"
"""A name `FsStore` never lists: a file the writer renamed or linked from a temp it hides."""


@dataclass(frozen=True)
class Step:
    path: str
    """Final path, relative to the recorded root."""
    source: str | None = None
    """None: written in place. Else the path it was written under and renamed from ("": a
    temp name no listing shows)."""


class Recorder:
    """Records, with inotify, the writes into ``folders`` (created if missing, every one under
    ``root``). A folder the writer creates inside them is not watched: the recording fails."""

    def __init__(self, root: Path, folders: list[Path]) -> None:
        self.root = root
        self.folders = folders
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = -1
        self._watches: dict[int, Path] = {}
        self._events: list[tuple[Path, str, int, int]] = []

    def __enter__(self) -> Self:
        self._fd = self._libc.inotify_init1(IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        mask = IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)
        for folder in self.folders:
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), mask)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder} failed")
            self._watches[wd] = folder
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._drain()
        finally:
            os.close(self._fd)

    def _drain(self) -> None:
        while True:
            try:
                buffer = os.read(self._fd, 1 << 20)
            except BlockingIOError:  # EAGAIN: every queued event is read
                return
            offset = 0
            while offset < len(buffer):
                wd, mask, cookie, length = _EVENT.unpack_from(buffer, offset)
                raw = buffer[offset + _EVENT.size : offset + _EVENT.size + length]
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    raise AssertionError("inotify queue overflowed: the write order is lost")
                name = os.fsdecode(raw.rstrip(b"\0"))
                self._events.append((self._watches[wd], name, mask, cookie))

    def steps(self) -> list[Step]:
        """Every file under the root, in the order it became complete under its final name."""
        done: dict[str, tuple[int, str | None]] = {}
        renamed_from: dict[int, str] = {}
        for index, (folder, name, mask, cookie) in enumerate(self._events):
            path = (folder / name).relative_to(self.root).as_posix()
            if mask & IN_ISDIR:
                if mask & IN_CREATE:
                    raise AssertionError(f"{path}: a folder made while writing is not watched")
                continue
            if mask & IN_CLOSE_WRITE:
                done[path] = (index, None)
            elif mask & IN_MOVED_FROM:
                renamed_from[cookie] = path
            elif mask & IN_MOVED_TO:
                done[path] = (index, renamed_from.get(cookie, ""))
            elif mask & IN_CREATE:
                done[path] = (index, "")  # a link(2); a later close after writing overrides
        final = sorted(p.relative_to(self.root).as_posix() for p in _files(self.root))
        unrecorded = [p for p in final if p not in done]
        assert not unrecorded, f"written outside the watched folders: {unrecorded}"
        return [Step(p, done[p][1]) for p in sorted(final, key=lambda p: done[p][0])]


def _files(root: Path) -> Iterator[Path]:
    return (p for p in root.rglob("*") if p.is_file())


class RecordingStore(FsStore):
    """A real `FsStore` that also records what was published, in order (every `put` renames a
    hidden temp into place, every `put_if_absent` links one)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.published: list[Step] = []

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        info = super().put(key, data, metadata=metadata)
        self.published.append(Step(key, ""))
        return info

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        info = super().put_if_absent(key, data, metadata=metadata)
        self.published.append(Step(key, ""))
        return info


def chunks(data: bytes, count: int) -> list[bytes]:
    """``data`` in ``count`` nearly equal pieces (fewer for a file shorter than ``count`` bytes,
    one empty piece for an empty file)."""
    bounds = sorted({len(data) * i // count for i in range(count + 1)})
    return [data[a:b] for a, b in pairwise(bounds)] or [b""]


def replay(
    steps: list[Step],
    source: Path,
    target: Path,
    after_each: Callable[[Step], None],
    pieces: int = 7,
    stop_after: int | None = None,
) -> None:
    """Write ``steps``' files from ``source`` into ``target`` chunk by chunk; after every chunk
    (and rename) call ``after_each(step)``. ``stop_after``: stop after that many calls, as a
    writer that died."""
    calls = 0
    for step in steps:
        final = target / step.path
        final.parent.mkdir(parents=True, exist_ok=True)
        if step.source is None:
            writing = final
        elif step.source:
            writing = target / step.source
        else:
            writing = final.with_name(HIDDEN_TEMP)
        parts = chunks((source / step.path).read_bytes(), pieces)
        for part in parts:
            with writing.open("ab") as out:
                out.write(part)
            calls += 1
            after_each(step)
            if calls == stop_after:
                return
        if writing != final:
            writing.rename(final)
            calls += 1
            after_each(step)
            if calls == stop_after:
                return
