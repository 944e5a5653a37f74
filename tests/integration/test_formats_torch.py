"""PyTorch DCP folders and torch-pickled Trainer files, made by the real libraries.

Every hostile case carries a payload that would create a marker file if it ever ran; each test
first proves the payload works (an unrestricted load creates its own marker), then that
verification gives a verdict without creating the marker.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import dcp_metadata, hf_trainer, latest_valid, sidecar, verify, verify_path
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore
from tests.support.sidecar_tools import commit_for, folder_with_sidecars, intent
from tests.support.torch_tools import (
    ExecPayload,
    Payload,
    require_torch,
    rewrite_metadata,
    torch_saved,
    training_state,
    write_dcp,
    write_hf_torch_files,
)
from tests.unit.test_formats import write_safetensors

DATA = "__0_0.distcp"


@pytest.fixture
def dcp_folder(tmp_path: Path) -> Path:
    return write_dcp(tmp_path / "step-100")


def test_dcp_written_by_torch_is_valid(dcp_folder: Path) -> None:
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.format is CheckpointFormat.TORCH_DCP
    assert report.step == 7  # the state dict's own `step` item wins over the folder name
    assert "step:state-dict-item" in report.checks
    assert {
        "dcp-metadata:restricted-unpickle",
        "storage-entries-inside",
        "data-file-sizes",
        "items-stored",
        "checksums-recorded",
        "dcp-bytes:weights_only",
    } <= set(report.checks)
    assert set(report.checksums) == {DATA, ".metadata"}
    assert all(v.startswith("xxh3_64:") for v in report.checksums.values())
    assert report.bytes_read == sum(p.stat().st_size for p in dcp_folder.iterdir())


def test_dcp_step_from_the_folder_name_when_none_is_saved(tmp_path: Path) -> None:
    folder = write_dcp(tmp_path / "checkpoint-1200", step=None)
    report = verify(FsStore(tmp_path), "checkpoint-1200")
    assert report.verdict is Verdict.VALID, report.reasons
    assert (report.step, report.checks[-1]) == (1200, "step:folder-name")
    shutil.move(folder, tmp_path / "final")
    report = verify_path(tmp_path / "final")
    assert (report.verdict, report.step) == (Verdict.VALID, None)
    assert "step:none" in report.checks


def test_dcp_metadata_parses_without_torch_classes(dcp_folder: Path) -> None:
    metadata = dcp_metadata.parse((dcp_folder / ".metadata").read_bytes())
    assert metadata.items["model.0.weight"].kind == "tensor"
    assert metadata.items["model.0.weight"].size == (16, 8)
    assert metadata.items["model.0.weight"].dtype == dcp_metadata.DType("float32", 4)
    assert metadata.items["extra.half"].dtype == dcp_metadata.DType("bfloat16", 2)
    assert metadata.items["step"].kind == "bytes"
    assert {e.relative_path for e in metadata.storage} == {DATA}
    assert metadata.needed_sizes(lambda p: p) == {DATA: (dcp_folder / DATA).stat().st_size}


def test_dcp_missing_data_file_is_incomplete(dcp_folder: Path) -> None:
    (dcp_folder / DATA).unlink()
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.INCOMPLETE
    assert any(DATA in r and "missing" in r for r in report.reasons)


def test_dcp_without_metadata_never_committed(dcp_folder: Path) -> None:
    (dcp_folder / ".metadata").unlink()
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.INCOMPLETE
    assert any("never committed" in r for r in report.reasons)


def test_dcp_truncated_data_file_is_corrupt(dcp_folder: Path) -> None:
    data = (dcp_folder / DATA).read_bytes()
    (dcp_folder / DATA).write_bytes(data[:-100])
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.CORRUPT
    assert any(f"needs at least {len(data)}" in r for r in report.reasons)


def test_dcp_flipped_bytes_change_the_recorded_checksum(dcp_folder: Path) -> None:
    first = verify_path(dcp_folder)
    raw = bytearray((dcp_folder / DATA).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (dcp_folder / DATA).write_bytes(bytes(raw))
    second = verify_path(dcp_folder)
    # DCP records no checksum: the first verify's digest is the reference that exposes the flip.
    assert second.checksums[DATA] != first.checksums[DATA]
    assert second.checksums[".metadata"] == first.checksums[".metadata"]


def _hostile_pickles(marker: Path) -> dict[str, bytes]:
    return {
        "os.system": pickle.dumps(Payload(marker)),
        "builtins.exec": pickle.dumps(ExecPayload(marker), protocol=2),
        "protocol-0": pickle.dumps(Payload(marker), protocol=0),
    }


@pytest.mark.parametrize("kind", ["os.system", "builtins.exec", "protocol-0"])
def test_dcp_hostile_metadata_is_unsafe_and_never_runs(
    dcp_folder: Path, tmp_path: Path, kind: str
) -> None:
    control, marker = tmp_path / "control", tmp_path / "marker"
    pickle.loads(_hostile_pickles(control)[kind])
    assert control.exists()
    (dcp_folder / ".metadata").write_bytes(_hostile_pickles(marker)[kind])
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.UNSAFE
    assert any("refusing to unpickle" in r for r in report.reasons)
    assert not marker.exists()


def test_dcp_payload_hidden_inside_real_metadata_is_unsafe(
    dcp_folder: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"

    def plant(metadata: Any) -> None:
        metadata.planner_data = {"model.0.weight": Payload(marker)}

    rewrite_metadata(dcp_folder, plant)
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.UNSAFE
    assert any("posix.system" in r or "os.system" in r for r in report.reasons)
    assert not marker.exists()


def test_dcp_hostile_bytes_item_is_unsafe(tmp_path: Path) -> None:
    """DCP's own loader unpickles "bytes" items with weights_only=False; we never do."""
    torch = require_torch()
    marker = tmp_path / "marker"
    state = training_state(torch)
    state["evil"] = Payload(marker)
    folder = write_dcp(tmp_path / "step-1", state)
    report = verify_path(folder)
    assert report.verdict is Verdict.UNSAFE
    assert any("'evil'" in r and "global posix.system" in r for r in report.reasons)
    assert not marker.exists()


def _move_entry(path: str) -> Any:
    def change(metadata: Any) -> None:
        for info in metadata.storage_data.values():
            info.relative_path = path
            break

    return change


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x"])
def test_dcp_storage_entry_leaving_the_checkpoint_is_unsafe(dcp_folder: Path, path: str) -> None:
    rewrite_metadata(dcp_folder, _move_entry(path))
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.UNSAFE
    assert any(repr(path) in r and "outside" in r for r in report.reasons)


def test_dcp_data_file_symlinked_outside_is_unsafe(dcp_folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.distcp"
    shutil.move(dcp_folder / DATA, outside)
    (dcp_folder / DATA).symlink_to(outside)
    assert verify_path(dcp_folder).verdict is Verdict.UNSAFE


def test_dcp_item_without_storage_is_corrupt(dcp_folder: Path) -> None:
    def drop(metadata: Any) -> None:
        key = next(k for k in metadata.storage_data if k.fqn == "model.0.weight")
        del metadata.storage_data[key]

    rewrite_metadata(dcp_folder, drop)
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.CORRUPT
    assert any("'model.0.weight' chunk at [0, 0] has no storage entry" in r for r in report.reasons)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "empty"),
        (b"\x00garbage that is no pickle at all" * 10, "not a readable pickle"),
        (pickle.dumps({"state_dict_metadata": {}}), "not Metadata"),
        (b"\x80\x04N.", "not Metadata"),
        (b"\x80\x04" + b"]" * 200_000 + b"a" * 199_999 + b".", "not Metadata"),  # deep nesting
    ],
)
def test_dcp_garbage_metadata_is_corrupt(dcp_folder: Path, content: bytes, says: str) -> None:
    (dcp_folder / ".metadata").write_bytes(content)
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.CORRUPT
    assert any(says in r for r in report.reasons), report.reasons


def test_dcp_giant_metadata_is_refused_unread(dcp_folder: Path) -> None:
    with (dcp_folder / ".metadata").open("r+b") as f:
        f.truncate(dcp_metadata.MAX_METADATA_BYTES + 1)  # sparse: cheap to make
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.CORRUPT
    assert any("limit" in r for r in report.reasons)
    assert report.bytes_read == 0


def test_latest_valid_skips_a_damaged_newer_dcp(tmp_path: Path) -> None:
    write_dcp(tmp_path / "step-10", step=None)
    write_dcp(tmp_path / "step-20", step=None)
    (tmp_path / "step-20" / DATA).unlink()
    chosen, reports = latest_valid(FsStore(tmp_path))
    assert chosen == "step-10"
    assert [(f, r.verdict) for f, r in reports] == [
        ("step-20", Verdict.INCOMPLETE),
        ("step-10", Verdict.VALID),
    ]


# -- Hugging Face Trainer files written by torch.save ----------------------------------------


def write_hf_folder(folder: Path, *, step: int = 500, weights: str = "safetensors") -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "mlp"}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if weights == "safetensors":
        write_safetensors(folder / "model.safetensors")
    else:
        torch = require_torch()
        torch.save(torch.nn.Linear(4, 2).state_dict(), folder / "pytorch_model.bin")
    write_hf_torch_files(folder)


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_hf_trainer_torch_files_load_with_weights_only(tmp_path: Path, weights: str) -> None:
    write_hf_folder(tmp_path / "checkpoint-500", weights=weights)
    report = verify_path(tmp_path / "checkpoint-500")
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.exact_resume is True
    assert "torch-load:weights_only" in report.checks
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(report.checksums)


def test_hf_trainer_hostile_optimizer_is_unsafe_and_never_runs(tmp_path: Path) -> None:
    torch = require_torch()
    folder = tmp_path / "checkpoint-500"
    write_hf_folder(folder)
    control, marker = tmp_path / "control", tmp_path / "marker"
    state = torch.load(folder / "optimizer.pt", weights_only=True)
    live = torch_saved({**state, "hook": Payload(control)})
    torch.load(io.BytesIO(live), weights_only=False)  # proves the payload is live
    assert control.exists()
    (folder / "optimizer.pt").write_bytes(torch_saved({**state, "hook": Payload(marker)}))
    report = verify_path(folder)
    assert report.verdict is Verdict.UNSAFE
    assert any(
        "optimizer.pt: refused by the restricted unpickler: pickle asks for global posix.system"
        in r
        for r in report.reasons
    )
    assert not marker.exists()


def test_hf_trainer_truncated_torch_file_is_corrupt(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-500"
    write_hf_folder(folder)
    data = (folder / "scheduler.pt").read_bytes()
    (folder / "scheduler.pt").write_bytes(data[: len(data) // 2])
    report = verify_path(folder)
    assert report.verdict is Verdict.CORRUPT
    assert any("scheduler.pt: not loadable" in r for r in report.reasons)


def test_bare_pytorch_model_bin(tmp_path: Path) -> None:
    torch = require_torch()
    good = tmp_path / "good" / "pytorch_model.bin"
    good.parent.mkdir()
    torch.save(torch.nn.Linear(4, 2).state_dict(), good)
    report = verify_path(good)
    assert report.verdict is Verdict.VALID, report.reasons
    assert "torch-load:weights_only" in report.checks

    marker = tmp_path / "marker"
    bad = tmp_path / "bad" / "pytorch_model.bin"
    bad.parent.mkdir()
    bad.write_bytes(torch_saved({"w": torch.ones(2), "x": ExecPayload(marker)}))
    report = verify_path(bad)
    assert report.verdict is Verdict.UNSAFE
    assert not marker.exists()


def test_without_torch_the_pickles_are_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch is optional: absent, every pickle is still read by the restricted unpickler (a
    hostile one is unsafe), only the extra weights-only load does not run, and the report says
    so."""
    from ckpt_ha.formats import torch_load

    torch = require_torch()
    write_hf_folder(tmp_path / "checkpoint-500")
    write_dcp(tmp_path / "step-3", step=None)
    hostile = tmp_path / "hostile" / "checkpoint-500"
    write_hf_folder(hostile)
    state = torch.load(hostile / "optimizer.pt", weights_only=True)
    (hostile / "optimizer.pt").write_bytes(torch_saved({**state, "x": Payload(tmp_path / "m")}))
    monkeypatch.setattr(torch_load, "torch_module", lambda: None)
    hf = verify_path(tmp_path / "checkpoint-500")
    assert hf.verdict is Verdict.VALID, hf.reasons
    assert {"torch-pickle:restricted", "torch-load:not-run (torch not installed)"} <= set(hf.checks)
    assert verify_path(hostile).verdict is Verdict.UNSAFE
    dcp = verify_path(tmp_path / "step-3")
    assert dcp.verdict is Verdict.VALID, dcp.reasons
    assert "dcp-bytes:not-loaded (torch not installed)" in dcp.checks


def test_no_torch_needed_to_read_dcp_metadata(dcp_folder: Path) -> None:
    """The restricted unpickler resolves nothing from torch: run it where torch cannot import."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from ckpt_ha.formats import verify_path\n"
        "from pathlib import Path\n"
        f"r = verify_path(Path({str(dcp_folder)!r}))\n"
        "print(r.verdict.value, r.step, sys.modules.get('torch') is not None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
        cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["valid", "7", "False"]


# -- the restricted unpickler itself (no torch needed) ---------------------------------------


def test_shared_stand_ins_cannot_be_modified_by_a_pickle() -> None:
    # BUILD {"itemsize": 1} on torch.float32: would change the stand-in for every later load.
    build = b"\x80\x04\x8c\x05torch\x8c\x07float32\x93}\x8c\x08itemsize\x4b\x01sb."
    with pytest.raises(dcp_metadata.MalformedMetadata, match="BUILD on DType"):
        dcp_metadata.parse(build)
    # BUILD with slot state on the torch.Size stand-in function: refused the same way.
    slots = b"\x80\x04\x8c\x05torch\x8c\x04Size\x93N}\x8c\x0b__defaults__)s\x86b."
    with pytest.raises(dcp_metadata.MalformedMetadata):
        dcp_metadata.parse(slots)
    assert dcp_metadata.ALLOWED[("torch", "float32")] == dcp_metadata.DType("float32", 4)


def test_extension_codes_and_persistent_ids_are_refused(tmp_path: Path) -> None:
    import copyreg

    copyreg.add_extension("posix", "system", 0xC4)
    try:
        # Refused before the extension registry is even asked what code 0xC4 names.
        with pytest.raises(dcp_metadata.UnsafeMetadata, match="extension code"):
            dcp_metadata.parse(b"\x80\x02\x82\xc4\x8c\x04true\x85R.")
    finally:
        copyreg.remove_extension("posix", "system", 0xC4)
    with pytest.raises(dcp_metadata.UnsafeMetadata, match="persistent id"):
        dcp_metadata.parse(b"\x80\x02\x8c\x01xQ.")


# -- ckpt-ha sidecars beside a DCP checkpoint ------------------------------------------------


def test_an_intent_without_a_commit_file_is_incomplete(dcp_folder: Path) -> None:
    folder_with_sidecars(dcp_folder, 100, commit=False)
    report = verify_path(dcp_folder)  # DCP's own .metadata is there, complete
    assert (report.verdict, report.format) == (Verdict.INCOMPLETE, CheckpointFormat.TORCH_DCP)
    assert report.reasons == [
        "ckpt-ha.identity.json without ckpt-ha.commit.json: a ckpt-ha integration started "
        "writing and never committed"
    ]


def test_a_commit_file_gives_step_sizes_and_checksums(dcp_folder: Path) -> None:
    store = FsStore(dcp_folder)
    sidecar.write_intent(store, "", intent(step=100))
    commit = commit_for(store, "", 100, algorithm="sha256", exact_resume=False)
    sidecar.write_commit(store, "", commit)
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.VALID, report.reasons
    assert (report.step, report.exact_resume) == (100, False)  # the commit's, not the item's 7
    assert {"commit-sidecar", "commit-sizes", "commit-checksums"} <= set(report.checks)
    assert "dcp-metadata:restricted-unpickle" in report.checks  # the format's own checks ran
    # Comparable with the commit's: the same algorithm, the same digests.
    assert report.checksums == {path: e.checksum for path, e in commit.files.items()}
    assert report.bytes_read == sum(e.size for e in commit.files.values())  # each read once
    assert report.notes == []


def _committed_dcp(folder: Path) -> None:
    folder_with_sidecars(folder, 100)


def test_damage_against_the_commit_file(tmp_path: Path) -> None:
    flipped = write_dcp(tmp_path / "flipped")
    _committed_dcp(flipped)
    raw = bytearray((flipped / DATA).read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # DCP's own checks cannot see this one
    (flipped / DATA).write_bytes(bytes(raw))
    report = verify_path(flipped)
    assert report.verdict is Verdict.CORRUPT
    assert any(
        r.startswith(f"{DATA}: checksum") and "commit file says" in r for r in report.reasons
    )

    missing = write_dcp(tmp_path / "missing")
    _committed_dcp(missing)
    (missing / DATA).unlink()
    report = verify_path(missing)
    assert report.verdict is Verdict.INCOMPLETE
    assert f"{DATA}: listed in the commit file but missing" in report.reasons

    extra = write_dcp(tmp_path / "extra")
    _committed_dcp(extra)
    (extra / "notes.txt").write_text("left by someone")
    report = verify_path(extra)
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.notes == ["1 file(s) not in ckpt-ha.commit.json, not part of the checkpoint: "
                            "notes.txt"]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "verdict"),
    [
        (b"{not json", Verdict.CORRUPT),
        (b'{"schema_version": 1, "step": 1, "files": {"../x": {"size": 1, "checksum": "a"}}}',
         Verdict.UNSAFE),
        (b'{"schema_version": 1, "step": 1, "files": {"/etc/passwd": {"size": 1, '
         b'"checksum": "a"}}}', Verdict.UNSAFE),
        (b'{"schema_version": 1, "step": 1, "files": {"ckpt-ha.identity.json": {"size": 1, '
         b'"checksum": "a"}}}', Verdict.CORRUPT),
    ],
)  # fmt: skip
def test_a_bad_commit_file(dcp_folder: Path, content: bytes, verdict: Verdict) -> None:
    folder_with_sidecars(dcp_folder, 100, commit=False)
    (dcp_folder / sidecar.COMMIT).write_bytes(content)
    report = verify_path(dcp_folder)
    assert report.verdict is verdict, report.reasons


def test_an_unreadable_intent_leaves_the_identity_unknown(dcp_folder: Path) -> None:
    folder_with_sidecars(dcp_folder, 100)
    (dcp_folder / sidecar.INTENT).write_text('{"schema_version": 2}')
    report = verify_path(dcp_folder)
    assert report.verdict is Verdict.VALID, report.reasons
    assert any("identity is unknown" in n for n in report.notes)


def test_torch_files_are_finished_when_their_zip_end_record_lands(tmp_path: Path) -> None:
    torch = require_torch()
    store = FsStore(tmp_path)
    data = torch_saved({"w": torch.ones(300)})
    for cut in (0, 3, 30, len(data) // 2, len(data) - 23, len(data) - 1):
        (tmp_path / "a.pt").write_bytes(data[:cut])
        assert not hf_trainer.torch_file_complete(store, "a.pt", cut), cut
    (tmp_path / "a.pt").write_bytes(data)
    assert hf_trainer.torch_file_complete(store, "a.pt", len(data))
    legacy = io.BytesIO()
    torch.save({"w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    (tmp_path / "b.pt").write_bytes(legacy.getvalue())  # a bare pickle: no end record to wait for
    assert hf_trainer.torch_file_complete(store, "b.pt", len(legacy.getvalue()))
