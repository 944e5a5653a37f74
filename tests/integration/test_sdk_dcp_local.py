"""Pure parts of `ckpt_ha.sdk.dcp`: which rank verifies which data file when a group resumes,
and checksums taken while DCP writes (real torch; the multi-rank paths are in
tests/integration/test_sdk_dcp.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats.sidecar import FileEvidence
from tests.support.torch_tools import require_torch

require_torch()
# Needs torch: imported after require_torch, so a missing torch fails the test, never errors.
from ckpt_ha.sdk.dcp import share  # noqa: E402
from ckpt_ha.sdk.dcp.checksumming import PIECE_BYTES, ChecksummingFileSystem  # noqa: E402

FILES = ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_every_file_is_verified_by_exactly_one_rank(size: int) -> None:
    shares = [share(FILES, rank, size) for rank in range(size)]
    assert sorted(name for mine in shares for name in mine) == sorted(FILES)


def test_a_rank_verifies_the_files_its_rank_wrote_when_the_world_is_the_same() -> None:
    assert share(FILES, 1, 4) == ["__1_0.distcp"]
    assert share(FILES, 0, 4) == ["__0_0.distcp", "__0_1.distcp"]
    assert share(FILES, 0, 2) == ["__0_0.distcp", "__0_1.distcp", "__2_0.distcp"]


def test_files_named_otherwise_are_spread_round_robin() -> None:
    assert [share(["a.distcp", "b.distcp"], rank, 2) for rank in (0, 1)] == [
        ["a.distcp"],
        ["b.distcp"],
    ]


def test_a_file_is_checksummed_as_it_is_written_and_renamed(tmp_path: Path) -> None:
    """Small writes are hashed whole, large ones piece by piece: the same digest as a read of
    the file, under the name DCP renames it to (as it does ``.metadata``)."""
    fs = ChecksummingFileSystem()
    small, large = os.urandom(1000), os.urandom(3 * PIECE_BYTES + 17)
    with fs.create_stream(tmp_path / "file.tmp", "wb") as stream:
        stream.write(small)
        stream.write(memoryview(large))
        stream.write(small)
        stream.flush()
        os.fsync(stream.fileno())
    fs.rename(tmp_path / "file.tmp", tmp_path / "file")
    data = (tmp_path / "file").read_bytes()
    expected = FileEvidence(size=len(data), checksum=cs.of_bytes(data, cs.WRITE_ALGORITHM))
    assert fs.written == {"file": expected}


def test_a_file_not_written_front_to_back_has_no_checksum(tmp_path: Path) -> None:
    """After a seek the bytes on disk are not the bytes that went by: the commit reads the
    file back instead of trusting the running checksum."""
    fs = ChecksummingFileSystem()
    with fs.create_stream(tmp_path / "file", "wb") as stream:
        stream.write(b"a" * 100)
        stream.seek(10)
        stream.write(b"b")
    assert fs.written == {}
