"""Reads held to a byte rate: a background reader (the scrub) takes at most its share of a
storage root's bandwidth, and training's reads the rest.

`ReadBudget` is the rate of one storage root (a `TokenBucket` of bytes behind a lock: the
formats read a checkpoint's files on several threads). `BudgetedStore` wraps that root's store
for one reader: every read through it is cut into pieces of at most `PIECE` bytes, and each piece
waits for its bytes *before* it is read, so the storage never sees more than
``burst + bytes_per_s * t`` bytes from this reader in any ``t`` seconds, however large the
reads its caller asks for (a whole torch file in one ``read()``). A piece is charged what it
will read, not what it asks for: a stream knows how much is left (its range, or the object's
size from one `stat` when it is opened whole), so the read that finds the end, or a small file
read with a large buffer, waits for nothing it does not read. An object that grew after that
`stat` has its extra bytes charged after they are read (the next read waits for them).

The store's API is synchronous and runs on a storage worker thread (`bounded`), so the wait is a
blocking sleep there, never on the event loop; clock and sleep are injected for tests.
Only reads are budgeted: writes, listings, stats and moves go straight through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import BinaryIO, Self

from ckpt_ha.core.token_bucket import TokenBucket
from ckpt_ha.storage.port import ListPage, ObjectInfo, ObjectStore, ReadStream

PIECE = 1024 * 1024
"""The largest read that goes to storage in one piece (the checksum loop's own chunk size)."""

DEFAULT_BURST_BYTES = 8 * PIECE


class ReadBudget:
    """At most ``bytes_per_s`` (0: unlimited, still counted) with ``burst_bytes`` saved up.

    ``on_read(n)`` after every ``n`` bytes read and ``on_wait(s)`` after every wait of ``s``
    seconds (metrics); both may be called from several threads.
    """

    def __init__(
        self,
        bytes_per_s: float,
        burst_bytes: int = DEFAULT_BURST_BYTES,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_read: Callable[[int], None] | None = None,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        if bytes_per_s < 0:
            raise ValueError(f"bytes_per_s must be >= 0 (0: unlimited), got {bytes_per_s}")
        self.bytes_per_s = bytes_per_s
        self.burst_bytes = burst_bytes
        self._clock = clock
        self._sleep = sleep
        self._on_read = on_read
        self._on_wait = on_wait
        self._lock = threading.Lock()
        self._bucket = (
            TokenBucket.full(bytes_per_s, burst_bytes, clock()) if bytes_per_s > 0 else None
        )
        self.bytes_read = 0
        self.waited_s = 0.0

    @property
    def limited(self) -> bool:
        return self._bucket is not None

    def seconds_for(self, nbytes: int) -> float:
        """The least time reading ``nbytes`` takes at this budget (0 when unlimited)."""
        return nbytes / self.bytes_per_s if self._bucket is not None else 0.0

    def take(self, n: int) -> None:
        """Wait until ``n`` bytes may be read."""
        if self._bucket is None or n == 0:
            return
        with self._lock:
            wait = self._bucket.reserve(n, self._clock())
        if wait > 0:
            self._sleep(wait)
            with self._lock:
                self.waited_s += wait
            if self._on_wait is not None:
                self._on_wait(wait)

    def used(self, taken: int, read: int) -> None:
        """``read`` bytes were read for the ``taken`` waited for: count them, give back what
        was not read, charge what was read beyond (the next `take` waits for it)."""
        with self._lock:
            self.bytes_read += read
            if self._bucket is not None and taken > read:
                self._bucket.refund(taken - read, self._clock())
            elif self._bucket is not None and read > taken:
                self._bucket.reserve(read - taken, self._clock())
        if self._on_read is not None and read:
            self._on_read(read)


class _BudgetedStream:
    """`ReadStream` whose reads go to storage in budgeted pieces."""

    def __init__(self, inner: ReadStream, budget: ReadBudget, left: int) -> None:
        self._inner = inner
        self._budget = budget
        self._left = left
        """What the stream is expected to hold still (what a piece is charged at most)."""

    def read(self, size: int = -1, /) -> bytes:
        if 0 <= size <= PIECE:
            return self._piece(size)
        parts: list[bytes] = []
        left = size
        while left != 0:
            part = self._piece(PIECE if left < 0 else min(PIECE, left))
            if not part:
                break
            parts.append(part)
            left = left - len(part) if left > 0 else left
        return b"".join(parts)

    def _piece(self, size: int) -> bytes:
        want = min(size, self._left)
        self._budget.take(want)
        data = self._inner.read(size)  # the whole size: an object that grew is read on
        self._budget.used(want, len(data))
        self._left = max(0, self._left - len(data))
        return data

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class _BudgetedFileStream(_BudgetedStream):
    """The same over a stream that can ``readinto`` (local files): the checksum's fast path."""

    def __init__(self, inner: ReadStream, budget: ReadBudget, left: int) -> None:
        super().__init__(inner, budget, left)
        self._readinto: Callable[[memoryview], int] = inner.readinto  # type: ignore[attr-defined]

    def readinto(self, buffer: memoryview, /) -> int:
        piece = buffer[:PIECE]
        want = min(len(piece), self._left)
        self._budget.take(want)
        n = self._readinto(piece)
        self._budget.used(want, n)
        self._left = max(0, self._left - n)
        return n


class BudgetedStore(ObjectStore):
    """``inner`` with its reads held to ``budget``; everything else is ``inner``'s own."""

    def __init__(self, inner: ObjectStore, budget: ReadBudget) -> None:
        self.inner = inner
        self.budget = budget

    def over(self, inner: ObjectStore) -> BudgetedStore:
        """The same budget over another view of the same root (a store rooted at one checkpoint
        folder, `formats.paths.confine`)."""
        return BudgetedStore(inner, self.budget)

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        stream = self.inner.open_read(key, offset=offset, length=length)
        try:
            left = length if length is not None else self._size(key) - offset
        except BaseException:
            stream.close()
            raise
        left = max(0, left)
        if hasattr(stream, "readinto"):
            return _BudgetedFileStream(stream, self.budget, left)
        return _BudgetedStream(stream, self.budget, left)

    def _size(self, key: str) -> int:
        """The object's size when the budget needs it (not when unlimited: no extra call)."""
        return self.inner.stat(key).size if self.budget.limited else 0

    def read_bytes(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        with self.open_read(key, offset=offset, length=length) as stream:
            return stream.read()

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after=start_after, page_size=page_size)

    def list_page(
        self, prefix: str = "", *, cursor: str | None = None, page_size: int = 1000
    ) -> ListPage:
        return self.inner.list_page(prefix, cursor=cursor, page_size=page_size)

    def stat(self, key: str) -> ObjectInfo:
        return self.inner.stat(key)

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return self.inner.put(key, data, metadata=metadata)

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return self.inner.put_if_absent(key, data, metadata=metadata)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        return self.inner.copy(src_key, dst_key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        return self.inner.move(src_key, dst_key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def quarantine(self, key: str, prefix: str = "quarantine/") -> str:
        return self.inner.quarantine(key, prefix)

    def uri(self, key: str) -> str:
        return self.inner.uri(key)
