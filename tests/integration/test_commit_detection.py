"""Commit detection against real libraries writing slowly.

Each writer runs for real once (safetensors, transformers' sharded ``save_pretrained``, a
Hugging Face ``Trainer``, ``torch.distributed.checkpoint.save``, the native SDK, DCP beside
ckpt-ha sidecars) while the order of its writes is recorded (`tests.support.write_order`). Its
files are then replayed into a watched root in that order, seven chunks per file, with the
writer-watcher's scan and decision after every chunk. A checkpoint is committed exactly when its
last byte lands, never before (so it is never verified, called corrupt or quarantined under its
writer), and `formats.verify` agrees at every intermediate state; a replay that stops midway
becomes ``write_failed`` after the stall timeout. ``ckpt-ha verify`` gives the same verdicts
offline.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
)
from ckpt_ha.contracts.envelope import EventData
from ckpt_ha.formats import sidecar, verify
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import FsStore, key_for_uri
from ckpt_ha.writer_watcher import adapters, domain
from tests.support.sidecar_tools import commit_for, intent
from tests.support.torch_tools import require_torch, run_trainer, tiny_gpt2, write_dcp
from tests.support.write_order import Recorder, RecordingStore, Step, replay

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)


@dataclass(frozen=True)
class Written:
    """What a real writer wrote under ``root`` (laid out as a watched root: <job>/<folder>/…),
    and the order it wrote it in."""

    root: Path
    steps: list[Step]
    expect: dict[str, tuple[CheckpointFormat, int]]
    """Folder → the format and step its `committed` event must carry."""


def recorded(root: Path, folders: list[str], write: Callable[[], None]) -> list[Step]:
    with Recorder(root, [root / f for f in folders]) as recorder:
        write()
    return recorder.steps()


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """A real Trainer run, once for the module: checkpoint-2 and checkpoint-4."""
    root = tmp_path_factory.mktemp("trainer")
    out = root / "job-hf"
    folders = ["job-hf", "job-hf/checkpoint-2", "job-hf/checkpoint-4"]
    steps = recorded(root, folders, lambda: run_trainer(out, max_steps=4, save_steps=2))
    expect = {
        "job-hf/checkpoint-2": (CheckpointFormat.HF_TRAINER, 2),
        "job-hf/checkpoint-4": (CheckpointFormat.HF_TRAINER, 4),
    }
    return Written(root, steps, expect)


def _safetensors_file(root: Path) -> Written:
    require_torch()
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in tiny_gpt2().transformer.state_dict().items()}
    target = root / "job-st" / "weights" / "model.safetensors"
    steps = recorded(root, ["job-st/weights"], lambda: save_file(tensors, str(target)))
    return Written(root, steps, {"job-st/weights": (CheckpointFormat.SAFETENSORS, 0)})


def _sharded(root: Path) -> Written:
    model = tiny_gpt2()
    folder = root / "job-sh" / "final"
    steps = recorded(
        root, ["job-sh/final"], lambda: model.save_pretrained(folder, max_shard_size="40KB")
    )
    assert len([s for s in steps if s.path.endswith(".safetensors")]) >= 3
    return Written(root, steps, {"job-sh/final": (CheckpointFormat.SAFETENSORS, 0)})


def _dcp(root: Path) -> Written:
    folder = root / "job-dcp" / "step-40"
    steps = recorded(root, ["job-dcp/step-40"], lambda: write_dcp(folder))
    assert Step("job-dcp/step-40/.metadata", "job-dcp/step-40/.metadata.tmp") in steps
    return Written(root, steps, {"job-dcp/step-40": (CheckpointFormat.TORCH_DCP, 7)})


def _dcp_with_sidecars(root: Path) -> Written:
    """What a ckpt-ha DCP integration does: intent first, ``dcp.save``, the commit file last."""
    folder = root / "job-dcp" / "step-50"
    store = FsStore(root)

    def write() -> None:
        sidecar.write_intent(store, "job-dcp/step-50", intent(step=50))
        write_dcp(folder)
        sidecar.write_commit(store, "job-dcp/step-50", commit_for(store, "job-dcp/step-50", 50))

    steps = recorded(root, ["job-dcp/step-50"], write)
    assert steps[0].path.endswith(sidecar.INTENT)
    assert steps[-1].path.endswith(sidecar.COMMIT)
    return Written(root, steps, {"job-dcp/step-50": (CheckpointFormat.TORCH_DCP, 50)})


def _native(root: Path) -> Written:
    from ckpt_ha import sdk

    store = RecordingStore(root)
    state = {"model": tiny_gpt2().transformer.state_dict(), "epoch": 1}
    saved = sdk.save(store, "job-n", 3, state, run_id="run-1")
    folder = key_for_uri(store, saved.uri)
    assert folder == "job-n/step-00000003"
    return Written(root, store.published, {folder: (CheckpointFormat.NATIVE, 3)})


WRITERS: dict[str, Callable[[Path], Written]] = {
    "safetensors-file": _safetensors_file,
    "safetensors-sharded": _sharded,
    "dcp": _dcp,
    "dcp-with-sidecars": _dcp_with_sidecars,
    "native-sdk": _native,
}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Written:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return WRITERS[request.param](tmp_path_factory.mktemp(request.param))


def folder_of(path: str) -> str:
    return "/".join(path.split("/", 2)[:2])


@dataclass
class Watch:
    """The writer-watcher's scan and decision over a root after every write, on a fake clock,
    with `formats.verify` alongside: what the integrity-checker would conclude right then."""

    root: Path
    now: datetime = T0
    calls: int = 0
    state: domain.WatchState = field(default_factory=domain.WatchState)
    events: list[tuple[int, EventData]] = field(default_factory=list)
    verified_at_commit: dict[str, Report] = field(default_factory=dict)
    last_write: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store = FsStore(self.root)

    def after_write(self, step: Step) -> None:
        self.calls += 1
        self.last_write[folder_of(step.path)] = self.calls
        self.scan(timedelta(seconds=1))

    def scan(self, elapsed: timedelta) -> list[EventData]:
        self.now += elapsed
        seen = list(adapters.scan(self.store))
        assert domain.needs_registry(self.state, seen) == [], "a committed folder lost files"
        new = domain.observe(self.state, seen, self.now, STALL)
        self.events += [(self.calls, event) for event in new]
        committed = {
            key_for_uri(self.store, e.uri) for e in new if isinstance(e, CheckpointCommittedV1)
        }
        for obs in seen:
            report = verify(self.store, obs.folder)
            if obs.folder in committed:
                self.verified_at_commit[obs.folder] = report
            elif self.state.folders[obs.folder].phase != "committed":
                # verify's rules agree with the watcher's: nothing unfinished passes either.
                assert not report.ok, (obs.folder, self.calls, sorted(obs.files))
        return new

    def of_type(self, kind: type[EventData]) -> list[tuple[int, EventData]]:
        return [(call, e) for call, e in self.events if isinstance(e, kind)]


def replay_watched(written: Written, target: Path, stop_after: int | None = None) -> Watch:
    target.mkdir()
    watch = Watch(target)
    replay(written.steps, written.root, target, watch.after_write, stop_after=stop_after)
    return watch


def assert_committed_exactly_at_the_last_byte(written: Written, watch: Watch) -> None:
    committed = watch.of_type(CheckpointCommittedV1)
    folders = [key_for_uri(watch.store, e.uri) for _, e in committed]
    assert sorted(folders) == sorted(written.expect), "exactly one committed per checkpoint"
    for (call, event), folder in zip(committed, folders, strict=True):
        assert isinstance(event, CheckpointCommittedV1)
        assert call == watch.last_write[folder], f"{folder} committed at write {call}"
        assert (event.format, event.step) == written.expect[folder]
        report = watch.verified_at_commit[folder]
        assert report.verdict is Verdict.VALID, (folder, report.reasons)
    assert [e for _, e in watch.events if not isinstance(
        e, CheckpointWritingV1 | CheckpointCommittedV1)] == []  # fmt: skip


def test_a_slow_writer_is_committed_exactly_at_its_last_byte(
    written: Written, tmp_path: Path
) -> None:
    watch = replay_watched(written, tmp_path / "watched")
    assert_committed_exactly_at_the_last_byte(written, watch)


def test_a_slow_trainer_is_committed_exactly_at_its_last_byte(
    trainer: Written, tmp_path: Path
) -> None:
    order = [Path(s.path).name for s in trainer.steps if "checkpoint-2" in s.path]
    assert order[-1] == "trainer_state.json"  # the Trainer's commit marker, written last
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(order)
    watch = replay_watched(trainer, tmp_path / "watched")
    assert_committed_exactly_at_the_last_byte(trainer, watch)
    for folder in trainer.expect:
        assert watch.verified_at_commit[folder].exact_resume is True


def assert_stall_fails(watch: Watch) -> None:
    assert watch.of_type(CheckpointCommittedV1) == []
    # The first scan after the writer died: its files stopped changing, the write is announced
    # (if no earlier scan could: a single file written in place moves the checkpoint id).
    assert {type(e) for e in watch.scan(timedelta(seconds=1))} <= {CheckpointWritingV1}
    assert len(watch.of_type(CheckpointWritingV1)) == 1
    failed = watch.scan(STALL)
    assert [type(e) for e in failed] == [CheckpointWriteFailedV1]
    assert isinstance(failed[0], CheckpointWriteFailedV1)
    assert "write stalled" in failed[0].reason
    assert watch.scan(STALL * 2) == []  # said once


def test_a_writer_that_dies_midway_becomes_write_failed(written: Written, tmp_path: Path) -> None:
    halfway = 7 * len(written.steps) // 2
    watch = replay_watched(written, tmp_path / "watched", stop_after=halfway)
    assert_stall_fails(watch)


def test_a_trainer_killed_mid_save_becomes_write_failed(trainer: Written, tmp_path: Path) -> None:
    # Killed while writing checkpoint-2's optimizer state: model.safetensors is complete.
    upto = next(i for i, s in enumerate(trainer.steps) if s.path.endswith("optimizer.pt"))
    watch = replay_watched(trainer, tmp_path / "watched", stop_after=7 * upto + 3)
    assert_stall_fails(watch)
    [(_, writing)] = watch.of_type(CheckpointWritingV1)
    assert isinstance(writing, CheckpointWritingV1)
    assert writing.format is CheckpointFormat.HF_TRAINER


# -- the same rules offline: ckpt-ha verify and latest-valid ---------------------------------


def ckpt_ha(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_verify_a_trainer_folder_killed_mid_save(trainer: Written, tmp_path: Path) -> None:
    out = tmp_path / "job-hf"
    shutil.copytree(trainer.root / "job-hf", out)
    killed = out / "checkpoint-4"
    (killed / "trainer_state.json").unlink()
    (killed / "optimizer.pt").write_bytes(b"")  # opened, never written: model.safetensors is whole

    run = ckpt_ha("verify", str(killed))
    assert run.returncode == 1, run.stdout
    assert run.stdout.startswith(f"INCOMPLETE  {killed}  format=hf_trainer")
    assert "trainer_state.json is missing" in run.stdout

    latest = ckpt_ha("latest-valid", str(out))
    assert latest.returncode == 0, latest.stderr
    assert f"LATEST VALID  {out / 'checkpoint-2'}  step=2" in latest.stdout
    assert f"rejected  {killed}" in latest.stdout


def test_a_trainer_folder_without_rng_state_is_weights_only(
    trainer: Written, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoint-2"
    shutil.copytree(trainer.root / "job-hf" / "checkpoint-2", folder)
    (folder / "rng_state.pth").unlink()
    report = verify(FsStore(tmp_path), "checkpoint-2")
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.exact_resume is False
    assert any(c.startswith("weights-only: no rng_state*.pth") for c in report.checks)
    latest = ckpt_ha("latest-valid", str(tmp_path))
    assert latest.stdout.endswith("step=2  (weights only: not an exact resume)\n"), latest
