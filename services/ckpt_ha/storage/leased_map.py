"""A whole local file handed to a reader that maps it itself, only while that is safe.

A reader that maps a file (``torch.load(mmap=True)``) touches only the pages it needs instead
of reading every byte into memory first; but touching a mapped page past the end of a file
that shrank under the map, or a page whose read from disk fails, kills the process with
SIGBUS. Both are made safe here, so the file is handed over (`leased_whole`) only when:

* a **read lease** is held on the file (``fcntl(F_SETLEASE, F_RDLCK)``): the kernel refuses it
  while anyone has the file open for writing, and while it is held, anyone who opens the file
  for writing or truncates it waits (up to ``/proc/sys/fs/lease-break-time``, 45 s by
  default) until the holder lets go. No signal is taken: the lease's notification goes to a
  signal ignored by default (SIGURG), and its owner is cleared once the lease is held. Leases
  exist on local filesystems only (NFS and parallel filesystems refuse them) and need the
  file's owner or CAP_LEASE: elsewhere the file is read. A breaker that opens with O_NONBLOCK
  gets EWOULDBLOCK instead of waiting.
* all of it is **in the page cache** (``cachestat``, Linux 6.5): a resident page is never read
  from disk, so no I/O error can fault there. A file that is not resident (a cold read, where
  the disk, not the copy, is the bound) is read. Without ``cachestat`` every file is read.
  What is left is a page evicted between the check and the read, whose re-read from disk
  fails in that instant.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import signal
from collections.abc import Iterator
from pathlib import Path

SMALLEST = 1024 * 1024
"""Ranges below this are read: the lease and the map cost more than the copy they save."""
_CACHESTAT = 451  # the same number on every architecture (a syscall after 5.x's unification)
_LEAST_BREAK_TIME = 5
"""Seconds a breaker must wait at least for the file to be handed over (the block is one load)."""


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
    that touch safe (see the module doc). The lease is let go when the block ends; a writer
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


def _warm(fd: int, start: int, end: int | None) -> bool:
    """The range is worth a map: large enough, and all in the page cache now (a cold range is
    bound by the disk, not by the copy: it is read, as it always was)."""
    size = os.fstat(fd).st_size
    end = size if end is None else min(end, size)  # a file's last chunk asks past its end
    return end - start >= SMALLEST and resident(fd, start, end - start)
