"""Checkpoint folders with hostile commit evidence: numbers of 5,000 digits, JSON nested 100,000
deep, values no event can carry, in every JSON file a reader parses (the native manifest, the
ckpt-ha sidecars, ``trainer_state.json``, ``config.json``, a safetensors header and index).

Each builder writes a complete, otherwise good folder and then spoils one file, so that what
the readers must survive is exactly that file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ckpt_ha.contracts.checkpoint import CheckpointIdentity
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import native, sidecar
from ckpt_ha.storage import FsStore

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HUGE = "9" * 5000
"""Past Python's 4,300-digit limit on int/str conversion: ``json.loads`` raises ValueError."""
DEEP = "[" * 100_000 + "]" * 100_000
"""Past every recursion limit: ``json.loads`` raises RecursionError."""


def write_native(folder: Path, step: int = 10, job: str = "job-good") -> Path:
    folder.mkdir(parents=True)
    identity = CheckpointIdentity(job_id=job, run_id="run-1", created_at=T0)
    shards = {"rank-0.bin": b"a" * 4096, "rank-1.bin": b"b" * 1024}
    native.write(FsStore(folder), "", shards, step=step, created_at=T0, identity=identity)
    return folder


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _safetensors_bytes(header: dict[str, object], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _trainer(folder: Path, step: int = 10) -> Path:
    folder.mkdir(parents=True)
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def _sidecars(folder: Path, step: int = 10) -> Path:
    folder.mkdir(parents=True)
    data = b"x" * 100
    (folder / "__0_0.distcp").write_bytes(data)
    identity = CheckpointIdentity(job_id="job-evil", run_id="run-1", created_at=T0)
    store = FsStore(folder)
    sidecar.write_intent(store, "", sidecar.Intent(identity=identity, format="torch_dcp"))
    evidence = sidecar.FileEvidence(size=len(data), checksum=cs.of_bytes(data))
    commit = sidecar.Commit(step=step, files={"__0_0.distcp": evidence})
    sidecar.write_commit(store, "", commit)
    return folder


def _manifest(folder: Path) -> Path:
    return write_native(folder, job="job-evil") / native.MANIFEST


def manifest_huge_step(folder: Path) -> None:
    _replace(_manifest(folder), '"step": 10', f'"step": {HUGE}')


def manifest_huge_size(folder: Path) -> None:
    _replace(_manifest(folder), '"size": 4096', f'"size": {HUGE}')


def manifest_deep(folder: Path) -> None:
    _manifest(folder).write_text(DEEP)


def manifest_step_past_2_53(folder: Path) -> None:
    _replace(_manifest(folder), '"step": 10', f'"step": {2**64}')


def manifest_huge_float(folder: Path) -> None:
    _replace(_manifest(folder), '"step": 10', f'"step": 1{"0" * 5000}.5')


def manifest_long_run_id(folder: Path) -> None:
    _replace(_manifest(folder), '"run-1"', f'"{"r" * 1_000_000}"')


def commit_huge_step(folder: Path) -> None:
    _replace(_sidecars(folder) / sidecar.COMMIT, '"step": 10', f'"step": {HUGE}')


def commit_deep(folder: Path) -> None:
    (_sidecars(folder) / sidecar.COMMIT).write_text(DEEP)


def intent_huge_attempt(folder: Path) -> None:
    path = _sidecars(folder) / sidecar.INTENT
    _replace(path, '"attempt": 1', f'"attempt": {HUGE}')
    (folder / sidecar.COMMIT).unlink()


def trainer_state_huge_step(folder: Path) -> None:
    (_trainer(folder) / "trainer_state.json").write_text(f'{{"global_step": {HUGE}}}')


def trainer_state_deep(folder: Path) -> None:
    (_trainer(folder) / "trainer_state.json").write_text(DEEP)


def config_huge(folder: Path) -> None:
    (_trainer(folder) / "config.json").write_text(f'{{"n_embd": {HUGE}}}')


def safetensors_huge_offset(folder: Path) -> None:
    folder.mkdir(parents=True)
    header = {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    raw = _safetensors_bytes(header, b"\x00" * 4)
    raw = raw.replace(b"[0, 4]", f"[0, {HUGE}]".encode())
    raw = struct.pack("<Q", len(raw) - 8 - 4) + raw[8:]
    (folder / "model.safetensors").write_bytes(raw)


def safetensors_huge_shape(folder: Path) -> None:
    """64 dimensions of 4,000 digits each: their product alone would take minutes."""
    folder.mkdir(parents=True)
    header = {"w": {"dtype": "F32", "shape": [10**4000] * 64, "data_offsets": [0, 4]}}
    (folder / "model.safetensors").write_bytes(_safetensors_bytes(header, b"\x00" * 4))


def safetensors_many_bad_tensors(folder: Path) -> None:
    """100,000 bad tensors: a reason for each would make a verdict no event can carry."""
    folder.mkdir(parents=True)
    bad = {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}
    header = {f"t{i}": bad for i in range(100_000)}
    (folder / "model.safetensors").write_bytes(_safetensors_bytes(header, b"\x00" * 4))


SHARD = "model-00001-of-00001.safetensors"


def _shard(folder: Path) -> Path:
    folder.mkdir(parents=True)
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(folder / SHARD))
    return folder / "model.safetensors.index.json"


def index_huge(folder: Path) -> None:
    weight_map = json.dumps({"w": SHARD})
    index = f'{{"metadata": {{"total_size": {HUGE}}}, "weight_map": {weight_map}}}'
    _shard(folder).write_text(index)


def index_deep(folder: Path) -> None:
    _shard(folder).write_text(DEEP)


CASES: dict[str, Callable[[Path], None]] = {
    "manifest-huge-step": manifest_huge_step,
    "manifest-huge-size": manifest_huge_size,
    "manifest-deep": manifest_deep,
    "manifest-step-past-2-53": manifest_step_past_2_53,
    "manifest-huge-float": manifest_huge_float,
    "manifest-long-run-id": manifest_long_run_id,
    "commit-huge-step": commit_huge_step,
    "commit-deep": commit_deep,
    "intent-huge-attempt": intent_huge_attempt,
    "trainer-state-huge-step": trainer_state_huge_step,
    "trainer-state-deep": trainer_state_deep,
    "config-huge": config_huge,
    "safetensors-huge-offset": safetensors_huge_offset,
    "safetensors-huge-shape": safetensors_huge_shape,
    "safetensors-many-bad-tensors": safetensors_many_bad_tensors,
    "index-huge": index_huge,
    "index-deep": index_deep,
}
"""name → builder of the hostile checkpoint folder at the path it is given."""


def build_case(root: Path, name: str) -> Path:
    """The hostile folder for ``name`` under ``root``."""
    folder = root / name
    CASES[name](folder)
    return folder
