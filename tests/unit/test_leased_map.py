"""`storage.leased_map`: a whole local file is handed to a reader that maps it itself only while
a read lease keeps it from shrinking and all its pages are in the page cache; a file open for
writing, or not in the page cache, gets no path (it is read). A checksum of a file truncated
under it, through the store, ends short (never SIGBUS, never a crash)."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from ckpt_ha.formats import checksum as cs
from ckpt_ha.storage import FsStore, leased_map

MIB = 1024 * 1024
SIZE = 24 * MIB + 12345


def _file(tmp_path: Path, size: int = SIZE) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / "f"
    with path.open("wb") as f:
        f.write(data)
        os.fsync(f.fileno())  # clean pages: a test can drop them from the page cache
    with path.open("rb") as f:  # into the page cache
        while f.read(MIB):
            pass
    return path, data


def _require_map() -> None:
    """The map's conditions (cachestat, Linux >= 6.5; leases; a break time >= 5 s), or a failed
    test saying which is missing (never a skip: without them these tests prove nothing)."""
    if not leased_map._usable:
        pytest.fail(
            "no cachestat or lease on this machine: no file is handed over, every one is read"
        )


def test_a_file_dropped_from_the_page_cache_is_not_resident(tmp_path: Path) -> None:
    path, _ = _file(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not leased_map.resident(fd, 0, SIZE)
    finally:
        os.close(fd)


def test_a_checksum_of_a_file_truncated_under_it_is_no_match(tmp_path: Path) -> None:
    """Through the store, as verification reads: the short read shows in the digest."""
    _require_map()
    path, data = _file(tmp_path, 3 * 32 * MIB)
    whole = cs.of_bytes(data, cs.WRITE_ALGORITHM)
    truncator = threading.Timer(0.02, os.truncate, args=(path, 10))
    truncator.start()
    digests = set()
    for _ in range(200):
        digests.add(cs.checksum(FsStore(tmp_path), "f", cs.WRITE_ALGORITHM)[0])
        if not truncator.is_alive():
            break
    truncator.join(timeout=30)
    assert not truncator.is_alive()
    final = cs.checksum(FsStore(tmp_path), "f", cs.WRITE_ALGORITHM)
    assert final[1] == 10
    assert final[0] != whole
    assert digests  # every checksum taken while the file shrank returned (none crashed)


def test_a_whole_warm_file_is_handed_over_as_a_path_only_under_its_lease(tmp_path: Path) -> None:
    """`leased_whole`: a path to the same file while the lease holds and it is all in the page
    cache; None for a file open for writing or not in the page cache; the lease let go after."""
    _require_map()
    path, data = _file(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with leased_map.leased_whole(fd) as whole:
            assert whole is not None
            assert Path(whole).read_bytes() == data
            assert fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
        assert fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_UNLCK
        with path.open("r+b"), leased_map.leased_whole(fd) as whole:  # a writer: no lease
            assert whole is None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with leased_map.leased_whole(fd) as whole:
            assert whole is None
    finally:
        os.close(fd)
