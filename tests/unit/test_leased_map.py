"""`storage.leased_map`: a local file hashed from a memory map only while a read lease keeps it
from shrinking and its pages are in the page cache; a file truncated under the map ends the
read short (never SIGBUS, never a crash), and the truncating process waits for the lease to
be let go; a file open for writing, or not in the page cache, is read into the buffer."""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from ckpt_ha.formats import checksum as cs
from ckpt_ha.storage import FsStore, leased_map

MIB = 1024 * 1024
SIZE = 6 * leased_map.PIECE + 12345


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


def _buffer() -> memoryview:
    return memoryview(mmap.mmap(-1, MIB))


def _read_all(path: Path, start: int = 0, end: int | None = None) -> tuple[bytes, int]:
    """(the bytes the pieces give, how many pieces came from the map)."""
    buffer = _buffer()
    out, mapped = bytearray(), 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for piece in leased_map.pieces(fd, start, end, buffer):
            mapped += piece.obj is not buffer.obj
            out += piece
    finally:
        os.close(fd)
    return bytes(out), mapped


def _require_map() -> None:
    """The map's conditions (cachestat, Linux >= 6.5; leases; a break time >= 5 s), or a failed
    test saying which is missing (never a skip: without them these tests prove nothing)."""
    if not leased_map._usable:
        pytest.fail("no cachestat or lease on this machine: every piece is read, nothing mapped")


def test_a_warm_file_is_hashed_from_the_map_and_gives_its_bytes(tmp_path: Path) -> None:
    _require_map()
    path, data = _file(tmp_path)
    got, mapped = _read_all(path)
    assert got == data
    assert mapped >= 6
    start, end = leased_map.PIECE - 7, 3 * leased_map.PIECE + 5  # a range, unaligned
    assert _read_all(path, start, end)[0] == data[start:end]
    assert _read_all(path, SIZE - 10, SIZE + MIB)[0] == data[-10:]  # past the end: short


def test_a_range_past_the_end_is_mapped_up_to_the_end(tmp_path: Path) -> None:
    """A file's last chunk asks for a whole chunk: its bytes in the page cache are still mapped."""
    _require_map()
    path, data = _file(tmp_path)
    got, mapped = _read_all(path, SIZE - 2 * MIB, SIZE + 30 * MIB)
    assert got == data[-2 * MIB :]
    assert mapped == 1


def test_a_file_open_for_writing_is_read_not_mapped(tmp_path: Path) -> None:
    path, data = _file(tmp_path)
    with path.open("r+b"):  # a writer: no read lease can be had
        got, mapped = _read_all(path)
    assert (got, mapped) == (data, 0)


def test_a_file_not_in_the_page_cache_is_read_not_mapped(tmp_path: Path) -> None:
    path, data = _file(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not leased_map.resident(fd, 0, SIZE)
    finally:
        os.close(fd)
    got, mapped = _read_all(path)
    assert (got, mapped) == (data, 0)


def test_a_file_truncated_under_the_map_waits_for_the_lease_and_the_rest_is_read(
    tmp_path: Path,
) -> None:
    """The truncation waits until the lease is let go; after the break no piece comes from the
    map (what is left is read with pread: short if the truncation has landed by then, the old
    bytes if it has not, never a fault)."""
    _require_map()
    path, data = _file(tmp_path)
    buffer = _buffer()
    fd = os.open(path, os.O_RDONLY)
    got = bytearray()
    mapped_after_break = 0
    truncator = None
    try:
        for piece in leased_map.pieces(fd, 0, None, buffer):
            if truncator is not None:
                mapped_after_break += piece.obj is not buffer.obj
            got += piece
            if truncator is None:  # another thread truncates: the same as another process
                assert piece.obj is not buffer.obj  # the first piece came from the map
                truncator = threading.Thread(target=os.truncate, args=(path, 10))
                truncator.start()
                deadline = time.monotonic() + 20
                while not leased_map._Lease(fd).breaking() and time.monotonic() < deadline:
                    time.sleep(0.01)  # until the kernel holds the truncation for the lease
                time.sleep(0.2)
                assert truncator.is_alive(), "the truncation did not wait for the lease"
    finally:
        os.close(fd)
    assert truncator is not None
    truncator.join(timeout=30)
    assert not truncator.is_alive()
    assert mapped_after_break == 0
    assert bytes(got) == data[: len(got)]
    assert path.stat().st_size == 10


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
