"""Format verification of Hugging Face Trainer folders written with real torch (the native
manifest and safetensors: tests/unit/test_formats.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import torch_load, verify, verify_path
from ckpt_ha.formats.report import Verdict
from ckpt_ha.storage import FsStore, leased_map
from tests.support.torch_tools import Payload, require_torch, torch_saved
from tests.unit.test_formats import _patch, write_hf


def test_hf_trainer_folder_exact_resume(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-500"
    write_hf(folder)
    report = verify(FsStore(tmp_path), "checkpoint-500")
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.format is CheckpointFormat.HF_TRAINER
    assert report.step == 500
    assert report.exact_resume is True
    assert {"model.safetensors", "optimizer.pt", "rng_state.pth"} <= set(report.checksums)


def test_hf_trainer_damage(tmp_path: Path) -> None:
    cases = {
        "no-step": lambda f: (f / "trainer_state.json").write_text('{"epoch": 1}'),
        "empty-optimizer": lambda f: (f / "optimizer.pt").write_bytes(b""),
        "not-a-torch-file": lambda f: (f / "scheduler.pt").write_bytes(b"hello world"),
        "broken-weights": lambda f: _patch(f / "model.safetensors", 0, struct.pack("<Q", 2**40)),
        "config-not-object": lambda f: (f / "config.json").write_text("[1, 2]"),
    }
    for name, damage in cases.items():
        folder = tmp_path / name / "checkpoint-500"
        write_hf(folder)
        damage(folder)
        report = verify(FsStore(tmp_path / name), "checkpoint-500")
        assert report.verdict is Verdict.CORRUPT, (name, report.reasons)
    missing = tmp_path / "missing" / "checkpoint-500"
    write_hf(missing)
    (missing / "model.safetensors").unlink()
    assert verify(FsStore(tmp_path / "missing"), "checkpoint-500").verdict is Verdict.INCOMPLETE
    renamed = tmp_path / "renamed" / "checkpoint-400"
    write_hf(renamed)  # trainer_state says 500: a copy under the wrong name
    report = verify(FsStore(tmp_path / "renamed"), "checkpoint-400")
    assert report.verdict is Verdict.CORRUPT
    assert any("says step 500" in r for r in report.reasons)


def test_a_trainer_folder_without_its_state_file_is_never_valid(tmp_path: Path) -> None:
    # Killed mid-save: the weights are whole, trainer_state.json (written last) never came.
    folder = tmp_path / "checkpoint-500"
    write_hf(folder)
    (folder / "trainer_state.json").unlink()
    (folder / "optimizer.pt").write_bytes(b"")
    report = verify_path(folder)
    assert (report.verdict, report.format) == (Verdict.INCOMPLETE, CheckpointFormat.HF_TRAINER)
    assert "trainer_state.json is missing" in report.reasons[0]
    assert report.step == 500  # from the folder name, so latest-valid lists it as rejected
    loose = tmp_path / "last"  # not named checkpoint-<n>: its Trainer-only files tell
    write_hf(loose)
    (loose / "trainer_state.json").unlink()
    assert verify_path(loose).verdict is Verdict.INCOMPLETE


def test_without_the_trial_load_the_pickles_and_checksums_are_still_checked(
    tmp_path: Path,
) -> None:
    """``trial_load=False`` (a resume whose Trainer loads the files itself next) leaves only
    torch's trial load out: a file that is no torch file, a pickle asking for code and the
    report's checksums are as with it."""
    folder = tmp_path / "valid" / "checkpoint-500"
    write_hf(folder)
    with_trial = verify(FsStore(tmp_path / "valid"), "checkpoint-500")
    without = verify(FsStore(tmp_path / "valid"), "checkpoint-500", trial_load=False)
    assert without.verdict is Verdict.VALID, without.reasons
    assert without.checksums == with_trial.checksums
    assert "torch-load:weights_only" in with_trial.checks
    assert "torch-load:left to the loader" in without.checks
    assert "torch-pickle:restricted" in without.checks

    damaged = tmp_path / "damaged" / "checkpoint-500"
    write_hf(damaged)
    (damaged / "scheduler.pt").write_bytes(b"hello world")
    report = verify(FsStore(tmp_path / "damaged"), "checkpoint-500", trial_load=False)
    assert report.verdict is Verdict.CORRUPT
    assert any("scheduler.pt" in r for r in report.reasons)

    hostile = tmp_path / "hostile" / "checkpoint-500"
    write_hf(hostile)
    marker = tmp_path / "marker"
    (hostile / "optimizer.pt").write_bytes(torch_saved({"state": {}, "hook": Payload(marker)}))
    report = verify(FsStore(tmp_path / "hostile"), "checkpoint-500", trial_load=False)
    assert report.verdict is Verdict.UNSAFE, report.reasons
    assert not marker.exists()


def _large_optimizer(folder: Path) -> None:
    """An ``optimizer.pt`` of 4 MiB, in the page cache: large enough to be loaded mapped."""
    torch = require_torch()
    moments = {"exp_avg": torch.ones(1024, 1024)}
    state = {"state": {0: moments}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    torch.save(state, folder / "optimizer.pt")
    (folder / "optimizer.pt").read_bytes()


def test_a_large_warm_torch_file_is_trial_loaded_from_its_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial load maps a warm local file (`torch_load.check_file`) instead of reading its
    bytes twice more; a record its archive lacks is caught there as it is from the bytes."""
    if not leased_map._usable:
        pytest.fail("no cachestat or lease on this machine: nothing is ever mapped")
    mapped: list[str] = []
    check_file = torch_load.check_file

    def counted(path: str, name: str, *, numpy_rng: bool = False) -> tuple[Verdict, str] | None:
        mapped.append(name)
        return check_file(path, name, numpy_rng=numpy_rng)

    monkeypatch.setattr(torch_load, "check_file", counted)
    folder = tmp_path / "checkpoint-500"
    write_hf(folder)
    _large_optimizer(folder)
    report = verify_path(folder)
    assert report.verdict is Verdict.VALID, report.reasons
    assert "torch-load:weights_only" in report.checks
    assert mapped == ["optimizer.pt"]

    torch = require_torch()
    state = torch.load(folder / "optimizer.pt", weights_only=True)
    torch.save({**state, "bad": _BadRebuild()}, folder / "optimizer.pt")  # allowed, but wrong
    (folder / "optimizer.pt").read_bytes()
    report = verify_path(folder)
    assert report.verdict is Verdict.CORRUPT
    assert any("optimizer.pt: not loadable" in r for r in report.reasons), report.reasons
    assert mapped == ["optimizer.pt", "optimizer.pt"]


class _BadRebuild:
    """Pickled as a call of torch's own tensor rebuild (an allowed global) with arguments it
    cannot take: the restricted unpickler passes it, torch's load fails on it."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        torch = require_torch()
        return torch._utils._rebuild_tensor_v2, ("not a storage",)
