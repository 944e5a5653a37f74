"""Checksums of the files DCP writes, taken as the bytes go by, so that committing a checkpoint
needs no second read of its data."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem

from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats.sidecar import FileEvidence

HASH_ALONGSIDE_BYTES = 1024 * 1024
"""Writes at least this large are hashed on a helper thread while they are written."""


class _HashingStream:
    """A file DCP writes, checksummed as the bytes go by. DCP writes a file front to back
    (``write``, ``tell``, ``flush``, ``fileno``); anything else (``seek``, ``truncate``, a short
    write) makes the checksum unusable, and the file is read back instead. A large write is
    hashed on a helper thread while this one writes it (both release the GIL), so checksumming
    costs the save almost no time."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._hasher = cs.new_hasher(cs.WRITE_ALGORITHM)
        self._helper: ThreadPoolExecutor | None = None
        self.size = 0
        self.in_order = True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) < HASH_ALONGSIDE_BYTES:
            written = self._raw.write(view)
            self._hasher.update(view)
        else:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(1, thread_name_prefix="ckpt-ha-dcp-hash")
            hashed = self._helper.submit(self._hasher.update, view)
            try:
                written = self._raw.write(view)
            finally:
                hashed.result()  # the caller may reuse the buffer once write returns
        if written is not None and written != len(view):
            self.in_order = False
        self.size += len(view)
        return len(view) if written is None else int(written)

    def tell(self) -> int:
        return int(self._raw.tell())

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown()
        if not self._raw.closed and self._raw.tell() != self.size:
            self.in_order = False
        self._raw.close()

    def evidence(self) -> FileEvidence | None:
        if not self.in_order:
            return None
        digest = f"{cs.WRITE_ALGORITHM}:{self._hasher.hexdigest()}"
        return FileEvidence(size=self.size, checksum=digest)

    def __getattr__(self, name: str) -> Any:
        if name not in ("flush", "fileno", "closed", "writable", "readable", "seekable"):
            self.in_order = False  # seek, truncate, writelines...: bytes we did not see
        return getattr(self._raw, name)


class ChecksummingFileSystem(FileSystem):
    """DCP's local filesystem, checksumming each file it writes on the way (so a commit needs
    no second read of the data): what was written, by file name in the folder."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, FileEvidence] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as opened:
                yield opened
            return
        with super().create_stream(path, mode) as raw:
            hashing = _HashingStream(raw)
            yield hashing
            hashing.close()
        evidence = hashing.evidence()
        with self._lock:
            self.written.pop(Path(path).name, None)
            if evidence is not None:
                self.written[Path(path).name] = evidence

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # how DCP publishes .metadata
        with self._lock:
            evidence = self.written.pop(Path(path).name, None)
            if evidence is not None:
                self.written[Path(new_path).name] = evidence
