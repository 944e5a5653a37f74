"""Streaming checksums over the storage port: each file is read once, in large ranged reads.

Default: xxh3-64 (about 17 GB/s per core here, so verification runs at storage speed). It
detects corruption, not tampering; sha256 (about 1.5 GB/s) is available where a cryptographic
digest is required.

Two forms, both read everywhere (``algorithm:hex``):

* whole-file, ``xxh3_64:<hex>``: one hash over the file's bytes (every manifest before the
  chunked form, and what verification computes for formats that record no checksum);
* chunked, ``xxh3_64/32MiB:<hex>``: the file cut into 32 MiB chunks (the last one shorter, an
  empty file none), each hashed alone, and the hex is the same hash over the chunks' digests
  one after the other (8 bytes each for xxh3-64, 32 for sha256). The chunks of one file are
  hashed in parallel when it is verified, so a single large file is checked at the speed of
  several cores, and a writer computes the same digest while it writes front to back
  (`new_hasher`). A flipped byte changes its chunk's digest, hence the file's; it is exactly
  as strong against corruption as the whole-file form (and, with sha256, against tampering:
  a hash of hashes).
"""

from __future__ import annotations

import hashlib
import mmap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from typing import Protocol, cast

import xxhash

from ckpt_ha.formats import parallel
from ckpt_ha.storage import ObjectStore, ReadStream, StorageError

DEFAULT_ALGORITHM = "xxh3_64"
READ_CHUNK = 1024 * 1024
CHUNK_BYTES = 32 * 1024 * 1024
"""The chunk of the chunked form ckpt-ha's writers record (`WRITE_ALGORITHM`)."""
WRITE_ALGORITHM = f"{DEFAULT_ALGORITHM}/{CHUNK_BYTES >> 20}MiB"
"""What ckpt-ha's framework integrations record in their commit files: chunked xxh3-64."""
_MAX_CHUNK_MIB = 1 << 20


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


class _Digester(_Hasher, Protocol):
    def digest(self) -> bytes: ...
    def copy(self) -> _Digester: ...


ALGORITHMS: dict[str, Callable[[], _Digester]] = {
    "xxh3_64": xxhash.xxh3_64,
    "sha256": hashlib.sha256,
}
"""The base hashes; each also has a chunked form, ``<base>/<n>MiB`` (`split`)."""


def split(algorithm: str) -> tuple[str, int | None]:
    """``xxh3_64`` → (``xxh3_64``, None); ``xxh3_64/32MiB`` → (``xxh3_64``, 32 MiB in bytes).
    Raises ValueError for anything else."""
    base, slash, size = algorithm.partition("/")
    if base not in ALGORITHMS:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}")
    if not slash:
        return base, None
    mib = size.removesuffix("MiB")
    if not size.endswith("MiB") or not mib.isdigit() or mib.startswith("0"):
        raise ValueError(f"checksum chunk {size!r} is not <n>MiB")
    if int(mib) > _MAX_CHUNK_MIB:
        raise ValueError(f"checksum chunk {size!r} is larger than {_MAX_CHUNK_MIB} MiB")
    return base, int(mib) << 20


def known(algorithm: str) -> bool:
    try:
        split(algorithm)
    except ValueError:
        return False
    return True


class _Chunked:
    """The chunked form computed front to back (a writer's stream, a small file)."""

    def __init__(self, base: str, chunk: int) -> None:
        self._new = ALGORITHMS[base]
        self._chunk = chunk
        self._outer = self._new()
        self._current: _Digester | None = None
        self._left = 0

    def update(self, data: bytes | memoryview, /) -> None:
        size = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if size < self._left:  # all inside the current chunk (a writer's many small writes)
            assert self._current is not None
            self._current.update(data)
            self._left -= size
            return
        view = memoryview(data).cast("B")
        while len(view):
            if self._current is None:
                self._current, self._left = self._new(), self._chunk
            take = min(self._left, len(view))
            self._current.update(view[:take])
            self._left -= take
            view = view[take:]
            if self._left == 0:
                self._outer.update(self._current.digest())
                self._current = None

    def hexdigest(self) -> str:
        outer = self._outer.copy()
        if self._current is not None:
            outer.update(self._current.digest())
        return str(outer.hexdigest())


def new_hasher(algorithm: str) -> _Hasher:
    """A hasher for ``algorithm`` in either form, fed front to back."""
    base, chunk = split(algorithm)
    return ALGORITHMS[base]() if chunk is None else _Chunked(base, chunk)


_observer: ContextVar[Callable[[int], None] | None] = ContextVar("checksum_reads", default=None)


@contextmanager
def observe_reads(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, ``callback(n)`` after every ``n`` bytes `checksum` reads (the progress
    of a long verify). A context variable reaches the one loop that reads the data without a
    parameter threaded through every format's reader; worker threads get it through
    `contextvars.copy_context` (`listed`). The callback may be called from several threads."""
    token = _observer.set(callback)
    try:
        yield
    finally:
        _observer.reset(token)


_first: ContextVar[dict[tuple[int, str, str], tuple[str, int]] | None] = ContextVar(
    "checksums_first", default=None
)


@contextmanager
def hashed_first(store: ObjectStore, keys: list[str], algorithm: str) -> Iterator[None]:
    """Checksum ``keys`` now, all together (the files and their chunks on the caller and the
    pool, `checksum_many`); within the block, `checksum` of one of them in ``algorithm`` on
    ``store`` returns its digest from here, once. A key that cannot be read is left out: its
    `checksum` reads it then, and raises as it would have.

    For a verification with Python work to do on each file (parse a header, a pickle): doing
    that work beside the hashing slows the hashing down far more than the work costs, since a
    thread busy in Python holds the GIL and every hashing thread waits for it, up to the
    switch interval (5 ms), each time it takes it back between two pieces. Hashed first, the
    files take every core, then the Python runs alone. The block's context reaches threads
    only through `contextvars.copy_context`."""

    found = checksum_many(store, keys, algorithm)
    done = {
        (id(store), key, algorithm): result
        for key, result in zip(keys, found, strict=True)
        if not isinstance(result, StorageError)
    }
    token = _first.set(done)
    try:
        yield
    finally:
        _first.reset(token)


def checksum(store: ObjectStore, key: str, algorithm: str = DEFAULT_ALGORITHM) -> tuple[str, int]:
    """(``algorithm:hex``, bytes read) of one object, streamed (`checksum_many` of one key,
    its error raised).

    Streams that can ``readinto`` fill one reused page-aligned buffer of `HASH_BUFFER` bytes
    (one per thread, `_buffer`): the hash then reads what the kernel's copy just left in the
    core's cache. Reading into fresh ``bytes`` objects costs several times the hashing itself,
    and hashing a warm file from a memory map instead (a leased map, since removed) was
    measured slower here: 300 MB warm, 28 ms on one thread and no faster on two, against 18.5
    ms and 13.7 ms through the buffer (2026-12-04, load 0.4). In the chunked form, an object
    of several chunks has its chunks read and hashed in parallel, in one run of consecutive
    chunks per thread (`checksum_many`).
    """
    found = checksum_many(store, [key], algorithm)[0]
    if isinstance(found, StorageError):
        raise found
    return found


def checksum_many(
    store: ObjectStore, keys: list[str], algorithm: str = DEFAULT_ALGORITHM
) -> list[tuple[str, int] | StorageError]:
    """`checksum` of each of ``keys``, in order, or the storage error that key raised.

    The work is one flat list of jobs on the caller and the pool (`parallel.run_all`),
    largest first, so no thread waits on a nested pool run and the small jobs fill the tail:
    a file in the whole-file form is one job; a file in the chunked form is cut into one run
    of consecutive chunks per thread (`_runs`), each run read front to back through one open
    file, each chunk hashed alone. One open per run, not per chunk: a file opened anew at a
    chunk's start loses the kernel's read-ahead, and a cold 315 MB file took 138 ms read
    chunk by chunk on one thread against 120 ms in one pass (2 threads: 173 ms a chunk at a
    time, 135 ms in two runs; a raw read 116-155 ms; 2026-12-04). A key `hashed_first`
    already computed is not read again.
    """
    first = _first.get()
    base, chunk = split(algorithm)
    results: list[tuple[str, int] | StorageError | None] = [None] * len(keys)
    sizes: list[int] = [0] * len(keys)
    jobs: list[tuple[int, int, int, int]] = []  # (bytes, key index, first chunk, chunks)
    for i, key in enumerate(keys):
        if first is not None and (found := first.pop((id(store), key, algorithm), None)):
            results[i] = found  # computed up front (`hashed_first`)
            continue
        if chunk is None:
            jobs.append((0, i, 0, 0))  # 0 chunks: the whole file, to its end
            continue
        try:
            sizes[i] = size = store.stat(key).size
        except StorageError as exc:
            results[i] = exc
            continue
        if size <= chunk:  # read to its end, whatever it has grown to
            jobs.append((size, i, 0, 0))
        else:
            jobs += [(min(n * chunk, size - at * chunk), i, at, n) for at, n in _runs(size, chunk)]
    jobs.sort(key=lambda job: -job[0])  # stable: equal runs stay in file order

    def job(i: int, at: int, count: int) -> Callable[[], tuple[str, int] | list[tuple[bytes, int]]]:
        context = copy_context()  # the read observer reaches the helper threads
        if not count:
            return lambda: context.run(_whole_digest, store, keys[i], algorithm)
        assert chunk is not None
        return lambda: context.run(_run_digests, store, keys[i], base, chunk, at, count)

    done = parallel.run_all([job(i, at, count) for _, i, at, count in jobs])
    parts: dict[int, list[tuple[int, list[tuple[bytes, int]]]]] = {}
    for (_, i, at, _), outcome in zip(jobs, done, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, StorageError):
                raise outcome
            if not isinstance(results[i], StorageError):
                results[i] = outcome  # the first error of the file's jobs, in job order
        elif isinstance(outcome, tuple):
            results[i] = (f"{algorithm}:{outcome[0]}", outcome[1])
        else:
            parts.setdefault(i, []).append((at, outcome))
    for i, runs in parts.items():
        if isinstance(results[i], StorageError):
            continue
        outer = ALGORITHMS[base]()
        total = 0
        for _, digests in sorted(runs, key=lambda run: run[0]):
            for digest, read in digests:
                outer.update(digest)
                total += read
        if total != sizes[i]:  # it shrank while it was read
            results[i] = (f"{algorithm}:short-read-{total}", total)  # matches no digest
        else:
            results[i] = (f"{algorithm}:{outer.hexdigest()}", total)
    assert all(result is not None for result in results)  # each key: a job or found above
    return cast("list[tuple[str, int] | StorageError]", results)


def _runs(size: int, chunk: int) -> list[tuple[int, int]]:
    """(first chunk, chunks) of each run a file of ``size`` bytes is cut into: as many runs
    as threads hash (`parallel.THREADS`), of equal counts of chunks."""
    chunks = -(-size // chunk)
    per = -(-chunks // min(parallel.THREADS, chunks))
    return [(at, min(per, chunks - at)) for at in range(0, chunks, per)]


def _whole_digest(store: ObjectStore, key: str, algorithm: str) -> tuple[str, int]:
    hasher = new_hasher(algorithm)
    with store.open_read(key) as stream:
        read = _hash_stream(stream, hasher, None)
    return hasher.hexdigest(), read


def _run_digests(
    store: ObjectStore, key: str, base: str, chunk: int, at: int, count: int
) -> list[tuple[bytes, int]]:
    """(digest, bytes read) of ``count`` chunks from chunk ``at``, read in one pass: fewer
    than ``count`` when the file ends first (it shrank: the sizes no longer add up)."""
    digests = []
    with store.open_read(key, offset=at * chunk, length=count * chunk) as stream:
        for _ in range(count):
            hasher = ALGORITHMS[base]()
            read = _hash_stream(stream, hasher, chunk)
            if not read:
                break
            digests.append((hasher.digest(), read))
    return digests


def _hash_stream(stream: ReadStream, hasher: _Hasher, limit: int | None) -> int:
    """Feed ``hasher`` from ``stream``, at most ``limit`` bytes (None: to its end)."""
    total = 0
    seen = _observer.get() or _ignore
    readinto = getattr(stream, "readinto", None)
    if readinto is None:
        while limit is None or total < limit:
            want = READ_CHUNK if limit is None else min(READ_CHUNK, limit - total)
            if not (piece := stream.read(want)):
                break
            hasher.update(piece)
            total += len(piece)
            seen(len(piece))
        return total
    view = _buffer()
    while limit is None or total < limit:
        n = readinto(view if limit is None or limit - total >= len(view) else view[: limit - total])
        if not n:
            break
        hasher.update(view[:n])
        total += n
        seen(n)
    return total


_buffers = threading.local()


HASH_BUFFER = 1024 * 1024
"""Bytes read at a time for hashing: small enough to stay in the core's cache (1 MiB of L2
here) between the kernel's copy and the hash, so the hash reads the cache, not memory, and
large enough that the kernel's per-read cost stays small: a warm 315 MB file read on one
thread took 32 ms in 256 KiB reads, 22 ms in 512 KiB, 17 ms in 1 MiB, 18 ms in 2 MiB and
20-30 ms in 4 MiB; read and hashed on two threads, 22, 17, 16, 17 and 23 ms (2026-12-04)."""


def _buffer() -> memoryview:
    """This thread's read buffer: page-aligned, `HASH_BUFFER` bytes, made once per thread (an
    mmap per file costs more than hashing a small file)."""
    view: memoryview | None = getattr(_buffers, "view", None)
    if view is None:
        view = _buffers.view = memoryview(mmap.mmap(-1, HASH_BUFFER))
    return view


def _ignore(_: int) -> None:
    pass


def of_bytes(data: bytes | memoryview, algorithm: str = DEFAULT_ALGORITHM) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return f"{algorithm}:{hasher.hexdigest()}"


class HashingReader:
    """``data`` as a file to read front to back (``read``; what `ObjectStore.put` copies from),
    each piece hashed just before it is handed out, never copied: the consumer's copy (the
    kernel's, into the page cache) then reads bytes the hash has just brought into the CPU
    cache, so the data crosses memory once for both (issue 32). `checksum` is the whole
    ``data``'s, taken from the pieces when they were read in order to the end, else (a consumer
    that stopped early) from ``data`` itself."""

    def __init__(self, data: bytes | memoryview, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self._view = memoryview(data).cast("B")
        self._algorithm = algorithm
        self._hasher = new_hasher(algorithm)
        self._at = 0

    def read(self, size: int = -1, /) -> memoryview:
        end = len(self._view) if size < 0 else min(self._at + size, len(self._view))
        piece = self._view[self._at : end]
        self._hasher.update(piece)
        self._at = end
        return piece

    def checksum(self) -> str:
        if self._at != len(self._view):
            return of_bytes(self._view, self._algorithm)
        return f"{self._algorithm}:{self._hasher.hexdigest()}"


def parse(value: str) -> tuple[str, str]:
    """``algorithm:hex`` → (algorithm, hex), either form; raises ValueError for an unknown
    algorithm."""
    algorithm, sep, digest = value.partition(":")
    if not sep or not known(algorithm) or not digest:
        raise ValueError(f"checksum {value!r} is not algorithm:hex with a known algorithm")
    return algorithm, digest
