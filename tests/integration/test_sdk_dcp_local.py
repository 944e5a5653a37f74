"""Pure parts of `ckpt_ha.sdk.dcp`: which rank verifies which data file when a group resumes,
checksums taken while DCP writes, and a one-process resume that reads tensors straight into
their targets and checks the files' checksums during that read (real torch, no bus; the
multi-rank paths are in tests/integration/test_sdk_dcp.py)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from ckpt_ha import sdk
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import verify_path
from ckpt_ha.formats.sidecar import FileEvidence
from ckpt_ha.sdk.protocol import BusEndpoint
from tests.support.resume_tools import plan_for
from tests.support.torch_tools import require_torch

torch = require_torch()
# Needs torch: imported after require_torch, so a missing torch fails the test, never errors.
from torch.distributed.checkpoint.filesystem import FileSystemReader  # noqa: E402

from ckpt_ha.sdk import dcp  # noqa: E402
from ckpt_ha.sdk.dcp import reading, share  # noqa: E402
from ckpt_ha.sdk.dcp.checksumming import PIECE_BYTES, ChecksummingFileSystem  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

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


# -- resume: tensors read into their targets, checksums taken on the way -----------------------


def _mixed() -> dict[str, object]:
    """Tensors read in place (float32, bfloat16, bool, a scalar, one of several pieces of
    hashing) and left to DCP's own read (a transposed one, a non-tensor item)."""
    torch.manual_seed(0)
    return {
        "big": torch.randn(3 * reading.PIECE_BYTES // 4 + 5),
        "half": torch.randn(64, 32).to(torch.bfloat16),
        "mask": torch.rand(33) > 0.5,
        "scalar": torch.tensor(7),
        "transposed": torch.randn(8, 4).t(),
        "extra": {"epoch": 3},
    }


def _zeroed(state: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[key] = torch.zeros(value.t().shape).t() if key == "transposed" else (
                torch.zeros_like(value))  # fmt: skip
        else:
            out[key] = {"epoch": 0}
    return out


def _resume(root: Path, target: dict[str, object]) -> dcp.DcpResumed | None:
    plan = plan_for(root, "job-r", 4).model_copy(update={"checkpoint_format": "torch_dcp"})
    ctx = sdk.Context("job-r", "run-2", 2, str(root), None, plan=plan)
    return dcp.resume(target, ctx=ctx)


def test_resume_reads_tensors_into_their_targets_and_verifies_on_the_way(tmp_path: Path) -> None:
    state = _mixed()
    dcp.save(state, step=4, job_id="job-r", storage_root=str(tmp_path), run_id="run-1")
    target = _zeroed(state)
    resumed = _resume(tmp_path, target)
    assert resumed is not None
    assert resumed.checksums_verified
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(target[key], value), key  # type: ignore[arg-type]
    assert target["extra"] == {"epoch": 3}


@pytest.mark.parametrize("where", ["header", "tensor", "last"])
def test_a_flipped_byte_anywhere_in_a_file_read_in_place_fails_the_resume(
    tmp_path: Path, where: str
) -> None:
    """A tensor's header, its bytes, the end of the file: every byte of a file loaded in place
    is in its checksum (a damaged header may fail the load too: the checksum explains it)."""
    state = _mixed()
    dcp.save(state, step=4, job_id="job-r", storage_root=str(tmp_path), run_id="run-1")
    folder = tmp_path / "job-r" / "step-00000004"
    stored = FileSystemReader(folder).read_metadata().storage_data
    item = {index.fqn: info for index, info in stored.items()}
    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    big = item["big"]
    flip = {"header": item["half"].offset + 10, "tensor": big.offset + big.length // 2}
    data[flip.get(where, len(data) - 1)] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(sdk.ResumeFailed, match="checksum mismatch"):
        _resume(tmp_path, _zeroed(state))


@pytest.mark.parametrize("algorithm", [cs.WRITE_ALGORITHM, "xxh3_64", "sha256/1MiB"])
def test_a_file_hashed_in_pieces_and_gaps_has_the_checksum_of_a_read(
    tmp_path: Path, algorithm: str
) -> None:
    """What a resume hashes while it loads (gaps read, tensor bytes as they land, the rest at
    the end) is the digest a read of the whole file gives, in both forms."""
    data = os.urandom(2 * 1024 * 1024 + 333)
    path = tmp_path / "file"
    path.write_bytes(data)
    hashing = reading.FileHash(algorithm)
    fd = os.open(path, os.O_RDONLY)
    try:
        hashing.catch_up(fd, 100)
        hashing.update(data[100 : 100 + 1024 * 1024])  # "read into a target"
        hashing.catch_up(fd, 1024 * 1024 + 5000)
        assert hashing.finish(fd) == (cs.of_bytes(data, algorithm), len(data))
    finally:
        os.close(fd)


# -- async_save: the bus is the commit thread's business ----------------------------------------


class _SilentBus:
    """A TCP port that accepts a connection and says nothing (a hung NATS server): the client
    waits for it until its timeout. `held_past_return`: the caller's call returned (`returned`)
    while the connection was held."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"nats://127.0.0.1:{self._server.getsockname()[1]}"
        self.returned = threading.Event()
        self.held_past_return = False
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        self.held_past_return = self.returned.wait(timeout=10)  # a bound, not a speed
        self._release.wait(timeout=60)
        conn.close()
        self._server.close()

    def release(self) -> None:
        self._release.set()
        self._thread.join(timeout=30)


def test_async_save_returns_while_its_writing_event_still_waits_for_the_bus(
    tmp_path: Path,
) -> None:
    """``checkpoint.writing`` is announced by the commit thread: a hung bus holds the commit
    thread (the save stays in flight), never the training loop's call."""
    bus = _SilentBus()
    try:
        handle = dcp.async_save({"w": torch.ones(8)}, step=3, job_id="job-b",
                                storage_root=str(tmp_path), run_id="run-1",
                                bus=BusEndpoint(url=bus.url, timeout_s=30.0))  # fmt: skip
        bus.returned.set()
        assert not handle.done()  # its commit thread waits for the bus
    finally:
        bus.release()
    saved = handle.result(timeout=60)
    assert bus.held_past_return
    assert not saved.announced_writing
    assert verify_path(tmp_path / "job-b" / "step-00000003").ok
