"""Copying a folder of objects from one store to another in bounded memory (copies of a
checkpoint on a replica).

Each object is streamed: the target's `put` reads from a seekable file over the source
(`SourceFile`), which reads a piece at a time (re-opening the source at an offset when the
target rewinds it to retry), so memory does not grow with the object's size whatever the two
backends are. Reads go through whatever store is passed as the source, e.g. a `BudgetedStore`
holding them to a read budget.

Resumable and never half-counted: objects already on the target with the source's size are not
copied again (`skip_same_size`; the caller verifies the whole copy afterwards anyway, and copies
again without skipping if that fails), and the objects named by ``last`` (the commit evidence of
a checkpoint: a manifest, a commit file) are written after every other one, so a copy cut short
never holds its commit evidence without the files it names.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

from ckpt_ha.storage.errors import ObjectNotFound
from ckpt_ha.storage.port import ObjectStore, ReadStream

PIECE = 1024 * 1024
"""How much of an object one read of `SourceFile` asks the source for at most."""


class SourceFile(io.RawIOBase):
    """A read-only, seekable file over one object of a store (``size`` known from its stat):
    what a target's `put` streams from. Seeking re-opens the source at the new offset; reads
    are at most `PIECE` bytes each."""

    def __init__(self, store: ObjectStore, key: str, size: int) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self.size = size
        self.pos = 0
        self._stream: ReadStream | None = None
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        target = max(0, base + offset)
        if target != self.pos:
            self._drop()
            self.pos = target
        return self.pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), PIECE, max(0, self.size - self.pos))
        if want == 0:
            return 0
        if self._stream is None:
            self._stream = self.store.open_read(self.key, offset=self.pos)
        readinto = getattr(self._stream, "readinto", None)
        if readinto is not None:  # a file: straight into the caller's buffer, no copy
            n = int(readinto(memoryview(buffer)[:want]))
        else:
            data = self._stream.read(want)
            n = len(data)
            buffer[:n] = data
        self.pos += n
        self.read_bytes += n
        return n

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def close(self) -> None:
        self._drop()
        super().close()


@dataclass(frozen=True)
class Copied:
    """What one folder copy did."""

    objects: int
    """Objects in the folder."""
    written: int
    """Objects written to the target (the others were there already with their size)."""
    bytes_written: int


def copy_folder(
    source: ObjectStore,
    target: ObjectStore,
    prefix: str,
    *,
    last: Callable[[str], bool] = lambda _key: False,
    skip_same_size: bool = True,
) -> Copied:
    """Copy every object under ``prefix/`` of ``source`` to the same key in ``target``; the
    objects for which ``last(key)`` holds are written after all the others. Objects already in
    ``target`` with the source's size are left as they are when ``skip_same_size``."""
    base = f"{prefix.rstrip('/')}/"
    items = list(source.list(base))
    ordered = sorted(items, key=lambda info: (last(info.key), info.key))
    written = bytes_written = 0
    for info in ordered:
        if skip_same_size:
            try:
                if target.stat(info.key).size == info.size:
                    continue
            except ObjectNotFound:
                pass
        with SourceFile(source, info.key, info.size) as stream:
            target.put(info.key, stream)  # type: ignore[arg-type]
            bytes_written += stream.read_bytes
        written += 1
    return Copied(objects=len(items), written=written, bytes_written=bytes_written)


def remove_folder(target: ObjectStore, prefix: str) -> int:
    """Delete every object under ``prefix/`` of ``target`` (a copy's folder on a replica);
    how many there were."""
    base = f"{prefix.rstrip('/')}/"
    keys = [info.key for info in target.list(base)]
    for key in keys:
        target.delete(key)
    return len(keys)
