"""The chunked checksum (``xxh3_64/<n>MiB``): the same digest front to back (a writer) and chunk
by chunk in parallel (a verification); manifests in the whole-file form and in the chunked form
both verify; a flipped byte in any chunk is caught."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import native, parallel, verify
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore, ObjectNotFound

MIB = 1024 * 1024
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("base", ["xxh3_64", "sha256"])
@pytest.mark.parametrize("size", [0, 1, MIB - 1, MIB, MIB + 1, 3 * MIB + MIB // 2])
def test_front_to_back_and_in_parallel_give_one_digest(
    tmp_path: Path, base: str, size: int
) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    algorithm = f"{base}/1MiB"
    written = cs.new_hasher(algorithm)
    for at in range(0, size, 300_001):  # a writer's writes do not line up with the chunks
        written.update(data[at : at + 300_001])
    read = cs.checksum(FsStore(tmp_path), "f", algorithm)
    assert read == (f"{algorithm}:{written.hexdigest()}", size)
    assert cs.of_bytes(data, algorithm) == read[0]
    chunks = [cs.ALGORITHMS[base]() for _ in range(0, size, MIB)]
    outer = cs.ALGORITHMS[base]()
    for i, hasher in enumerate(chunks):  # the definition, spelled out
        hasher.update(data[i * MIB : (i + 1) * MIB])
        outer.update(hasher.digest())
    assert read[0] == f"{algorithm}:{outer.hexdigest()}"
    if size:
        assert read[0].partition(":")[2] != cs.of_bytes(data, base).partition(":")[2]


def test_every_read_of_a_parallel_checksum_is_observed(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(os.urandom(5 * MIB + 7))
    seen: list[int] = []
    with cs.observe_reads(seen.append):
        _, read = cs.checksum(FsStore(tmp_path), "f", "xxh3_64/1MiB")
    assert sum(seen) == read == 5 * MIB + 7


@pytest.mark.parametrize(
    "algorithm",
    ["md5/1MiB", "xxh3_64/0MiB", "xxh3_64/01MiB", "xxh3_64/1", "xxh3_64/", "xxh3_64/xMiB"],
)
def test_an_unknown_form_is_refused(algorithm: str) -> None:
    assert not cs.known(algorithm)
    with pytest.raises(ValueError, match="known algorithm"):
        cs.parse(f"{algorithm}:00")


SHARDS = {
    "model/big.bin": os.urandom(3 * MIB + 12_345),
    "model/small.bin": os.urandom(1000),
    "optim.bin": os.urandom(2 * MIB),
}


def _write(root: Path, algorithm: str) -> Path:
    native.write(FsStore(root), "step-1", SHARDS, step=1, created_at=NOW, algorithm=algorithm)
    return root / "step-1"


@pytest.mark.parametrize("algorithm", ["xxh3_64", "sha256", "xxh3_64/1MiB", "sha256/1MiB"])
def test_old_and_new_manifests_both_verify(tmp_path: Path, algorithm: str) -> None:
    folder = _write(tmp_path, algorithm)
    manifest = (folder / native.MANIFEST).read_text()
    assert f'"{algorithm}:' in manifest
    report = verify(FsStore(tmp_path), "step-1")
    assert report.ok, report.reasons
    assert report.bytes_read == sum(map(len, SHARDS.values()))
    assert all(d.startswith(f"{algorithm}:") for d in report.checksums.values())


@pytest.mark.parametrize("at", [0, MIB - 1, MIB, 2 * MIB + 5, 3 * MIB + 12_344])
def test_a_flipped_byte_in_any_chunk_is_caught(tmp_path: Path, at: int) -> None:
    folder = _write(tmp_path, "xxh3_64/1MiB")
    path = folder / "model" / "big.bin"
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify(FsStore(tmp_path), "step-1")
    assert report.verdict is Verdict.CORRUPT
    assert [r.split(":")[0] for r in report.reasons] == ["model/big.bin"]


def test_files_hashed_first_are_read_once_and_give_the_same_digests(tmp_path: Path) -> None:
    """`hashed_first`: the digests computed up front are the ones `checksum` gives, each read
    once and handed out once; a file that could not be read then is read (and fails) later."""
    store = FsStore(tmp_path)
    for name, data in SHARDS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    algorithm = "xxh3_64/1MiB"
    direct = {name: cs.checksum(store, name, algorithm) for name in SHARDS}
    seen: list[int] = []
    with cs.observe_reads(seen.append), cs.hashed_first(store, [*SHARDS, "gone"], algorithm):
        assert sum(seen) == sum(map(len, SHARDS.values()))
        (tmp_path / "optim.bin").write_bytes(b"changed after it was hashed")
        assert {name: cs.checksum(store, name, algorithm) for name in SHARDS} == direct
        assert sum(seen) == sum(map(len, SHARDS.values()))  # nothing read twice
        assert cs.checksum(store, "optim.bin", algorithm) != direct["optim.bin"]  # once only
        with pytest.raises(ObjectNotFound):
            cs.checksum(store, "gone", algorithm)
        assert cs.checksum(store, "model/big.bin", "xxh3_64") != direct["model/big.bin"]
    assert cs.checksum(store, "model/small.bin", algorithm) == direct["model/small.bin"]


@pytest.mark.parametrize("algorithm", ["xxh3_64", "sha256", "xxh3_64/1MiB", "sha256/1MiB"])
def test_many_files_as_one_list_of_chunks_give_each_file_its_own_digest(
    tmp_path: Path, algorithm: str
) -> None:
    """`checksum_many`: every chunk of every file is one job on the threads, largest first;
    each file's digest and bytes read are what `checksum` of it alone gives, in the order
    asked, and a file that cannot be read is its error, beside the others' digests."""
    store = FsStore(tmp_path)
    sizes = {"a": 3 * MIB + 5, "b": 0, "c": MIB, "d": 7, "e": 2 * MIB + MIB // 2}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(size))
    keys = ["e", "gone", *sizes, "a"]
    found = cs.checksum_many(store, keys, algorithm)
    assert isinstance(found[1], ObjectNotFound)
    digests = [result for i, result in enumerate(found) if i != 1]
    assert digests == [cs.checksum(store, key, algorithm) for key in keys if key != "gone"]
    assert [read for _, read in digests] == [sizes[key] for key in keys if key != "gone"]
    assert len({digest for digest, _ in digests}) == len(sizes)  # "a" asked twice


def test_a_parallel_run_hands_back_each_error_in_its_place() -> None:
    def fail() -> int:
        raise OSError("no")

    done = parallel.run_all([lambda: 1, fail, lambda: 3])
    assert [done[0], done[2]] == [1, 3]
    assert isinstance(done[1], OSError)
    with pytest.raises(OSError, match="no"):
        parallel.run([lambda: 1, fail])


@pytest.mark.parametrize("algorithm", ["xxh3_64", "xxh3_64/1MiB"])
def test_a_hashing_reader_hands_out_the_bytes_and_their_checksum(
    tmp_path: Path, algorithm: str
) -> None:
    data = os.urandom(3 * MIB + 17)
    reader = cs.HashingReader(memoryview(data), algorithm)
    FsStore(tmp_path).put("f", reader)  # type: ignore[arg-type]  # a file to read, duck-typed
    assert (tmp_path / "f").read_bytes() == data
    assert reader.checksum() == cs.of_bytes(data, algorithm)


def test_a_hashing_reader_left_early_still_gives_the_whole_checksum() -> None:
    data = os.urandom(MIB + 5)
    reader = cs.HashingReader(data)
    assert bytes(reader.read(100)) == data[:100]
    assert reader.checksum() == cs.of_bytes(data)
    assert bytes(reader.read()) == data[100:]  # the rest, in order
    assert reader.read(10) == b""
    assert reader.checksum() == cs.of_bytes(data)
