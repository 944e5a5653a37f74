"""Format verification on real files: the native manifest and safetensors (made by the library)."""

from __future__ import annotations

import json
import os
import struct
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckpt_ha.contracts.checkpoint import CheckpointFormat, CheckpointIdentity
from ckpt_ha.formats import (
    checksum,
    detect,
    listed,
    native,
    parallel,
    safetensors,
    verify,
    verify_path,
)
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore, ObjectExists, ObjectStore
from ckpt_ha.storage.read_budget import BudgetedStore, ReadBudget
from tests.support.torch_tools import write_hf_torch_files

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SHARDS = {"model/rank-0.bin": os.urandom(70_000), "model/rank-1.bin": os.urandom(1234)}


def write_native(root: Path, algorithm: str = "xxh3_64") -> Path:
    folder = root / "step-100"
    folder.mkdir(parents=True)
    native.write(
        FsStore(folder),
        "",
        SHARDS,
        step=100,
        created_at=NOW,
        identity=CheckpointIdentity(job_id="j", run_id="r", code_version="abc123"),
        algorithm=algorithm,
    )
    return folder


@pytest.mark.parametrize("algorithm", ["xxh3_64", "sha256"])
def test_native_good(tmp_path: Path, algorithm: str) -> None:
    report = verify_path(write_native(tmp_path, algorithm))
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.format is CheckpointFormat.NATIVE
    assert report.step == 100
    assert report.exact_resume is True
    assert report.bytes_read == sum(len(v) for v in SHARDS.values())
    assert all(v.startswith(f"{algorithm}:") for v in report.checksums.values())
    assert {"manifest", "sizes", "checksums"} <= set(report.checks)


def test_native_manifest_is_create_only(tmp_path: Path) -> None:
    folder = write_native(tmp_path)
    with pytest.raises(ObjectExists):
        native.write(FsStore(folder), "", SHARDS, step=100, created_at=NOW)


def test_shards_without_manifest_are_never_valid(tmp_path: Path) -> None:
    folder = write_native(tmp_path)
    (folder / native.MANIFEST).unlink()
    report = verify_path(folder)  # a file appearing is never proof of completion
    assert report.verdict is Verdict.UNKNOWN
    assert native.verify(FsStore(folder), "").verdict is Verdict.INCOMPLETE


def test_missing_shard_is_incomplete(tmp_path: Path) -> None:
    folder = write_native(tmp_path)
    (folder / "model" / "rank-1.bin").unlink()
    report = verify_path(folder)
    assert report.verdict is Verdict.INCOMPLETE
    assert any("rank-1.bin" in r for r in report.reasons)


def test_truncated_and_flipped_shards_are_corrupt(tmp_path: Path) -> None:
    folder = write_native(tmp_path)
    shard0 = folder / "model" / "rank-0.bin"
    data = bytearray(shard0.read_bytes())
    data[500] ^= 0x01
    shard0.write_bytes(bytes(data))
    (folder / "model" / "rank-1.bin").write_bytes(b"short")
    report = verify_path(folder)
    assert report.verdict is Verdict.CORRUPT
    assert any("rank-0.bin: checksum" in r for r in report.reasons)
    assert any("rank-1.bin: size 5" in r for r in report.reasons)


def write_large_native(root: Path) -> dict[str, bytes]:
    """Eight shards holding more than `listed.INLINE_BYTES` together: checked on the pool."""
    shards = {f"model/rank-{i}.bin": os.urandom(300_000) for i in range(8)}
    assert sum(map(len, shards.values())) > listed.INLINE_BYTES
    native.write(FsStore(root), "step-1", shards, step=1, created_at=NOW)
    return shards


def test_files_checked_side_by_side_keep_their_order_and_every_read_is_observed(
    tmp_path: Path,
) -> None:
    shards = write_large_native(tmp_path)
    seen: list[int] = []
    with checksum.observe_reads(seen.append):  # called on the pool's threads too
        report = verify(FsStore(tmp_path), "step-1")
    assert report.ok, report.reasons
    assert list(report.checksums) == list(shards)
    assert sum(seen) == report.bytes_read == sum(map(len, shards.values()))

    folder = tmp_path / "step-1" / "model"
    (folder / "rank-6.bin").write_bytes(b"short")
    data = bytearray((folder / "rank-2.bin").read_bytes())
    data[7] ^= 0x01
    (folder / "rank-2.bin").write_bytes(bytes(data))
    report = verify(FsStore(tmp_path), "step-1")
    assert report.verdict is Verdict.CORRUPT
    assert [r.split(":")[0] for r in report.reasons] == ["model/rank-2.bin", "model/rank-6.bin"]


def test_a_verification_never_waits_for_a_busy_pool(tmp_path: Path) -> None:
    """Every pool thread busy (other checkpoints, a hung mount): the calling thread checks
    every file itself."""
    write_large_native(tmp_path)
    release = threading.Event()
    busy = [parallel._pool.submit(release.wait) for _ in range(parallel._pool.size)]
    try:
        report = verify(FsStore(tmp_path), "step-1")
        assert report.ok, report.reasons
        assert not any(b.done() for b in busy)  # verified while all of them were still busy
    finally:
        release.set()
    assert all(b.result(timeout=10) for b in busy)


def _rewrite_manifest(folder: Path, **changes: object) -> None:
    doc = json.loads((folder / native.MANIFEST).read_text())
    doc.update(changes)
    (folder / native.MANIFEST).write_text(json.dumps(doc))


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../x", "a\\..\\b"])
def test_manifest_paths_leaving_the_checkpoint_are_unsafe(tmp_path: Path, path: str) -> None:
    folder = write_native(tmp_path)
    _rewrite_manifest(folder, shards=[{"path": path, "size": 1, "checksum": "xxh3_64:00"}])
    assert verify_path(folder).verdict is Verdict.UNSAFE


def test_symlink_leaving_the_checkpoint_is_unsafe(tmp_path: Path) -> None:
    folder = write_native(tmp_path)
    outside = tmp_path / "secret.bin"
    outside.write_bytes(SHARDS["model/rank-1.bin"])
    target = folder / "model" / "rank-1.bin"
    target.unlink()
    target.symlink_to(outside)
    assert verify_path(folder).verdict is Verdict.UNSAFE


def test_a_shard_linked_into_another_checkpoint_is_unsafe_from_the_storage_root_too(
    tmp_path: Path,
) -> None:
    """The services verify a folder through the storage root's store: a shard linked into
    another job's checkpoint stays inside that root, and is still unsafe (as `verify_path`)."""
    victim = write_native(tmp_path / "victim")
    evil = write_native(tmp_path / "evil")
    target = evil / "model" / "rank-1.bin"
    target.unlink()
    target.symlink_to(victim / "model" / "rank-1.bin")
    root = FsStore(tmp_path)
    report = verify(root, "evil/step-100")
    assert report.verdict is Verdict.UNSAFE
    assert "outside" in report.reasons[0]
    assert verify_path(evil).verdict is Verdict.UNSAFE
    assert verify(root, "victim/step-100").ok


def test_a_checkpoint_folder_reached_through_a_symlink_is_unsafe(tmp_path: Path) -> None:
    victim = write_native(tmp_path / "victim")
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "step-100").symlink_to(victim)
    report = verify(FsStore(tmp_path), "evil/step-100")
    assert report.verdict is Verdict.UNSAFE
    assert "reached through a symlink" in report.reasons[0]


@pytest.mark.parametrize("budgeted", [False, True], ids=["store", "budgeted store"])
def test_one_verification_looks_up_the_folders_above_the_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budgeted: bool
) -> None:
    """Every format is verified inside `paths.one_reading` (the scrub's budgeted store too):
    the folders above the checkpoint's are looked up for links at the start (resolving the
    folder, then once for the block), the folder itself on every read."""
    folder = write_native(tmp_path / "storage" / "job")
    store: ObjectStore = FsStore(tmp_path / "storage")
    if budgeted:
        store = BudgetedStore(store, ReadBudget(0))
    looked_up: Counter[str] = Counter()
    lstat = os.lstat

    def counting(path: str, *args: Any, **kwargs: Any) -> os.stat_result:
        looked_up[os.fspath(path)] += 1
        return lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", counting)
    assert verify(store, "job/step-100").ok
    assert looked_up[str(folder)] >= 1 + len(SHARDS)  # the manifest and each shard, at least
    for above in (tmp_path, tmp_path / "storage", tmp_path / "storage" / "job"):
        assert looked_up[str(above)] <= 2, (above, looked_up)


@pytest.mark.parametrize(
    "content",
    [b"", b"\xff\xfe not utf-8", b"{not json", b"[" * 200_000 + b"]" * 200_000, b'{"step": -1}'],
)
def test_hostile_manifests_give_a_verdict(tmp_path: Path, content: bytes) -> None:
    folder = write_native(tmp_path)
    (folder / native.MANIFEST).write_bytes(content)
    report = verify_path(folder)
    assert report.verdict is Verdict.CORRUPT
    assert report.reasons


def write_safetensors(path: Path, n: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    tensors = {
        f"layer{i}.weight": rng.standard_normal((16, 8)).astype(np.float32) for i in range(n)
    }
    tensors["step"] = np.array([3], dtype=np.int64)
    save_file(tensors, str(path), metadata={"format": "np"})
    return tensors


def test_safetensors_single_file_good(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    report = verify_path(path)
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.format is CheckpointFormat.SAFETENSORS
    assert report.checksums["model.safetensors"].startswith("xxh3_64:")
    assert verify_path(tmp_path).verdict is Verdict.VALID  # as a folder too


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_safetensors_damage_is_corrupt(tmp_path: Path) -> None:
    cases = {
        "giant-header": lambda p: _patch(p, 0, struct.pack("<Q", 2**62)),
        "truncated": lambda p: p.write_bytes(p.read_bytes()[:-10]),
        "zero-bytes": lambda p: p.write_bytes(b""),
        "header-garbage": lambda p: _patch(p, 8, b"\xff\xff\xff"),
        "extra-bytes": lambda p: p.write_bytes(p.read_bytes() + b"\x00" * 4),
    }
    for name, damage in cases.items():
        path = tmp_path / f"{name}.safetensors"
        write_safetensors(path)
        damage(path)
        report = verify_path(path)
        assert report.verdict is Verdict.CORRUPT, (name, report.reasons)


def test_safetensors_offsets_must_match_dtype_and_shape(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 12)
    report = verify_path(path)
    assert report.verdict is Verdict.CORRUPT
    assert any("expected 16" in r for r in report.reasons)


def write_sharded(folder: Path) -> None:
    folder.mkdir()
    a = write_safetensors(folder / "model-00001-of-00002.safetensors", 1)
    b = {"head.weight": np.ones((4, 4), dtype=np.float16)}
    save_file(b, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = dict.fromkeys(a, "model-00001-of-00002.safetensors")
    weight_map.update(dict.fromkeys(b, "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_safetensors(tmp_path: Path) -> None:
    good = tmp_path / "good"
    write_sharded(good)
    assert verify_path(good).verdict is Verdict.VALID

    missing = tmp_path / "missing"
    write_sharded(missing)
    (missing / "model-00002-of-00002.safetensors").unlink()
    assert verify_path(missing).verdict is Verdict.INCOMPLETE

    escaping = tmp_path / "escaping"
    write_sharded(escaping)
    index = json.loads((escaping / "model.safetensors.index.json").read_text())
    index["weight_map"]["head.weight"] = "../good/model-00002-of-00002.safetensors"
    (escaping / "model.safetensors.index.json").write_text(json.dumps(index))
    assert verify_path(escaping).verdict is Verdict.UNSAFE

    lying = tmp_path / "lying"
    write_sharded(lying)
    index = json.loads((lying / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost.weight"] = "model-00002-of-00002.safetensors"
    (lying / "model.safetensors.index.json").write_text(json.dumps(index))
    report = verify_path(lying)
    assert report.verdict is Verdict.CORRUPT
    assert any("ghost.weight" in r for r in report.reasons)


def test_unknown_layouts_are_never_valid(tmp_path: Path) -> None:
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "weights.bin").write_bytes(b"x" * 10)
    assert verify_path(tmp_path / "unknown").verdict is Verdict.UNKNOWN
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / ".metadata").write_bytes(b"\x80\x04N.")
    (tmp_path / "dcp" / "__0_0.distcp").write_bytes(b"x")
    report = verify_path(tmp_path / "dcp")  # recognised, but None is no DCP metadata
    assert report.verdict is Verdict.CORRUPT
    assert report.format is CheckpointFormat.TORCH_DCP


def test_verify_through_the_store_with_a_prefix(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "job/step-7", SHARDS, step=7, created_at=NOW)
    report = verify(store, "job/step-7")
    assert report.verdict is Verdict.VALID
    assert report.step == 7


def write_hf(folder: Path, *, step: int = 500, resume: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "mlp", "hidden": 16}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 1.5}))
    write_safetensors(folder / "model.safetensors")
    if resume:
        write_hf_torch_files(folder)  # real torch.save files: they are loaded (weights_only)


def test_hf_trainer_without_optimizer_is_weights_only(tmp_path: Path) -> None:
    write_hf(tmp_path / "checkpoint-20", step=20, resume=False)
    report = verify_path(tmp_path / "checkpoint-20")
    assert report.verdict is Verdict.VALID
    assert report.exact_resume is False
    assert any("weights-only" in c for c in report.checks)


@pytest.mark.parametrize(
    ("folder", "names", "expected"),
    [
        ("checkpoint-5", {"model.safetensors", "config.json"}, CheckpointFormat.HF_TRAINER),
        ("final", {"model.safetensors", "optimizer.pt"}, CheckpointFormat.HF_TRAINER),
        ("final", {"model.safetensors", "rng_state_1.pth"}, CheckpointFormat.HF_TRAINER),
        ("final", {"model.safetensors", "config.json"}, CheckpointFormat.SAFETENSORS),
        ("checkpoint-5", {".metadata", "__0_0.distcp"}, CheckpointFormat.TORCH_DCP),
        ("x", {"ckpt-ha.identity.json", "__0_0.distcp"}, CheckpointFormat.TORCH_DCP),
        ("x", {"ckpt-ha.identity.json"}, CheckpointFormat.UNKNOWN),
    ],
)
def test_detect(folder: str, names: set[str], expected: CheckpointFormat) -> None:
    assert detect(names, folder) is expected


def test_safetensors_shards_without_their_index_are_incomplete(tmp_path: Path) -> None:
    folder = tmp_path / "final"
    write_sharded(folder)
    (folder / "model.safetensors.index.json").unlink()
    report = verify_path(folder)
    assert report.verdict is Verdict.INCOMPLETE
    assert "the index is written after the shards" in report.reasons[0]


def test_declared_size_reads_only_the_header(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path)
    data = path.read_bytes()
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    store = FsStore(tmp_path)
    for cut, expected in [(0, None), (7, None), (header_end - 1, None),
                          (header_end, len(data)), (len(data) - 1, len(data))]:  # fmt: skip
        path.write_bytes(data[:cut])
        assert safetensors.declared_size(store, path.name, cut) == expected, cut
    path.write_bytes(b"\xff" * 8 + b"{}")  # a length no header can have: judged as it is
    assert safetensors.declared_size(store, path.name, 10) == 10
