"""A range of a local file in pieces, from a memory map where that is safe, else read.

Hashing a file from the page cache through ``read()`` copies every byte into a buffer first;
on a machine of few cores that copy costs as much as the hash (`formats.checksum`). A memory
map drops the copy, but touching a mapped page past the end of a file that shrank under the
map, or a page whose read from disk fails, kills the process with SIGBUS. Both are made safe
here, so a map is used only when:

* a **read lease** is held on the file (``fcntl(F_SETLEASE, F_RDLCK)``): the kernel refuses it
  while anyone has the file open for writing, and while it is held, anyone who opens the file
  for writing or truncates it waits (up to ``/proc/sys/fs/lease-break-time``, 45 s by
  default) until the holder lets go. Before each piece the lease is polled (``F_GETLEASE``
  shows the pending break); on a break the map is dropped and the lease released at once,
  and the rest is read with ``pread``, which sees a shrunk file as a short read and never
  faults. No signal is taken: the lease's notification goes to a signal ignored by default
  (SIGURG), and its owner is cleared once the lease is held. A file that is unlinked or
  renamed over keeps its pages and needs no lease. Leases exist on local filesystems only (NFS
  and parallel filesystems refuse them) and need the file's owner or CAP_LEASE: elsewhere every
  piece is read. A breaker that opens with O_NONBLOCK gets EWOULDBLOCK instead of waiting.
* the piece is **in the page cache** (``cachestat``, Linux 6.5): a resident page is never read
  from disk, so no I/O error can fault there. A piece that is not resident (a cold read, where
  the disk, not the copy, is the bound) is read into the buffer. Without ``cachestat`` every
  piece is read. What is left is a page evicted between the check and the hash, whose
  re-read from disk fails in that instant.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

PIECE = 4 * 1024 * 1024
"""Bytes hashed between two polls of the lease (about 0.3 ms of xxh3 here)."""
SMALLEST = 1024 * 1024
"""Ranges below this are read: the lease and the map cost more than the copy they save."""
_CACHESTAT = 451  # the same number on every architecture (a syscall after 5.x's unification)
_MADV_POPULATE_READ = 22
_LEAST_BREAK_TIME = 5
"""Seconds a breaker must wait at least for the map to be used: a piece is hashed in less."""


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _break_time_ok() -> bool:
    try:
        return int(Path("/proc/sys/fs/lease-break-time").read_text()) >= _LEAST_BREAK_TIME
    except (OSError, ValueError):
        return False


_libc_handle = _libc()
_usable = _libc_handle is not None and _break_time_ok()
"""False when no map is ever used (no libc, or a lease breaker would not wait long enough)."""


def resident(fd: int, offset: int, length: int) -> bool:
    """Every page of [offset, offset+length) is in the page cache right now."""
    global _usable
    if _libc_handle is None or length <= 0:
        return False
    span, stat = _Range(offset, length), _Stat()
    if _libc_handle.syscall(_CACHESTAT, fd, ctypes.byref(span), ctypes.byref(stat), 0) != 0:
        if ctypes.get_errno() == 38:  # ENOSYS: a kernel before 6.5 — never map
            _usable = False
        return False
    first, last = offset // mmap.PAGESIZE, (offset + length - 1) // mmap.PAGESIZE
    return int(stat.cache) >= last - first + 1


class _Lease:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.held = False

    def take(self) -> bool:
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETSIG, signal.SIGURG)  # ignored unless handled
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
            self.held = True
            fcntl.fcntl(self.fd, fcntl.F_SETOWN, 0)  # and then no signal at all
        except OSError:  # open for writing, not ours, not a local filesystem
            return self.held
        return True

    def breaking(self) -> bool:
        try:
            return bool(fcntl.fcntl(self.fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK)
        except OSError:
            return True

    def release(self) -> None:
        if self.held:
            self.held = False
            with contextlib.suppress(OSError):  # closing the file lets go of it anyway
                fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


@contextlib.contextmanager
def leased_whole(fd: int) -> Iterator[str | None]:
    """For the block: a path that opens the file of ``fd`` itself (``/proc/self/fd/<fd>``: the
    same inode whatever is renamed or linked meanwhile), while a read lease holds it at its
    size and every page of it is in the page cache; None when either cannot be had (the
    caller reads the file instead). For a reader that maps the file itself (``torch.load``
    with ``mmap=True``): it touches only what it needs, and the lease and the residency make
    that touch as safe as `pieces`' maps. The lease is let go when the block ends; a writer
    that wants the file meanwhile waits for that (the block must be short: one load)."""
    path = f"/proc/self/fd/{fd}"
    if not (_usable and os.path.exists(path) and _warm(fd, 0, None)):  # no /proc: no path
        yield None
        return
    lease = _Lease(fd)
    if not lease.take():
        yield None
        return
    try:
        yield None if lease.breaking() else path
    finally:
        lease.release()


def pieces(fd: int, start: int, end: int | None, buffer: memoryview) -> Iterator[memoryview]:
    """The bytes of ``fd`` from ``start`` to ``end`` (None: to the end of the file), front to
    back, in pieces of at most `PIECE` bytes. Each piece is valid until the next is asked for
    (a view of the map, or of ``buffer``); the consumer must not keep it. Fewer bytes than
    asked when the file is shorter, or shrinks while it is read."""
    position = start
    if _usable and _warm(fd, start, end):
        lease = _Lease(fd)
        if lease.take():
            try:
                stopped = yield from _mapped(fd, lease, start, end, buffer)
            finally:
                lease.release()
            if stopped is None:
                return
            position = stopped  # the lease broke: the rest is read as the file is now
    yield from _read(fd, position, end, buffer)


def _mapped(
    fd: int, lease: _Lease, start: int, end: int | None, buffer: memoryview
) -> Generator[memoryview, None, int | None]:
    """Pieces while the lease holds; returns where a break stopped them (None: all done)."""
    size = os.fstat(fd).st_size  # with the lease held, the file cannot shrink below this
    stop = size if end is None else min(end, size)
    if stop - start < SMALLEST:
        return start
    base = start - start % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, stop - base, access=mmap.ACCESS_READ, offset=base) as mapped:
        position = start
        while position < stop:
            if lease.breaking():
                return position
            n = min(PIECE, stop - position)
            if _mappable(mapped, fd, position - base, position, n):
                view = memoryview(mapped)[position - base : position - base + n]
                try:
                    yield view
                finally:
                    view.release()
            else:
                got = os.preadv(fd, [buffer[: min(n, len(buffer))]], position)
                if got == 0:
                    return None
                yield buffer[:got]
                n = got
            position += n
    return None  # all of it: while the lease held, nothing shrank or grew the file


def _warm(fd: int, start: int, end: int | None) -> bool:
    """The range is worth a map: large enough, and all in the page cache now (a cold range is
    bound by the disk, not by the copy: it is read, as it always was)."""
    size = os.fstat(fd).st_size
    end = size if end is None else min(end, size)  # a file's last chunk asks past its end
    return end - start >= SMALLEST and resident(fd, start, end - start)


def _mappable(mapped: mmap.mmap, fd: int, at: int, position: int, n: int) -> bool:
    """The piece at ``at`` in the map (``position`` in the file) is resident, and its pages are
    mapped in now by ``MADV_POPULATE_READ`` (Linux 5.14), which reports a failed read from disk
    as an error where a fault would raise SIGBUS: a piece it fails for is read instead."""
    if not resident(fd, position, n):
        return False
    page = at % mmap.PAGESIZE
    try:
        mapped.madvise(_MADV_POPULATE_READ, at - page, n + page)
    except (OSError, ValueError):
        return False
    return True


def _read(fd: int, position: int, end: int | None, buffer: memoryview) -> Iterator[memoryview]:
    while end is None or position < end:
        want = len(buffer) if end is None else min(len(buffer), end - position)
        got = os.preadv(fd, [buffer[:want]], position)
        if got == 0:
            return
        yield buffer[:got]
        position += got
