"""Writer-watcher decisions on DCP and Trainer folders written with real torch (the rest:
tests/unit/test_writer_watcher.py)."""

from __future__ import annotations

import json
import pickle
from datetime import timedelta
from pathlib import Path

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
)
from ckpt_ha.formats import sidecar
from ckpt_ha.storage import FsStore
from ckpt_ha.writer_watcher import adapters
from ckpt_ha.writer_watcher.domain import Observation, WatchState, missing, observe
from tests.support.sidecar_tools import commit_for, intent
from tests.support.torch_tools import Payload, write_dcp, write_hf_torch_files
from tests.unit.test_writer_watcher import STALL, T0, _only, _save_safetensors, announced


def _dcp_observation(store: FsStore) -> Observation:
    [found] = list(adapters.scan(store))
    return found


def test_dcp_commits_only_when_every_data_file_holds_its_entries(tmp_path: Path) -> None:
    folder = write_dcp(tmp_path / "job-1" / "step-40", step=None)
    store = FsStore(tmp_path)
    data = (folder / "__0_0.distcp").read_bytes()
    complete = _dcp_observation(store)
    assert complete.evidence.format is CheckpointFormat.TORCH_DCP
    assert complete.evidence.required == {
        ".metadata": (folder / ".metadata").stat().st_size,
        "__0_0.distcp": len(data),
    }
    assert complete.evidence.step == 40

    (folder / "__0_0.distcp").write_bytes(data[:-1])  # .metadata there, a data file short
    state = WatchState()
    announced(state, _dcp_observation(store))
    (folder / "__0_0.distcp").unlink()  # .metadata there, a data file missing
    assert observe(state, [_dcp_observation(store)], T0 + timedelta(seconds=2), STALL) == []
    (folder / "__0_0.distcp").write_bytes(data)
    [committed] = observe(state, [_dcp_observation(store)], T0 + timedelta(seconds=4), STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert (committed.format, committed.step, committed.shard_count) == (
        CheckpointFormat.TORCH_DCP, 40, 2
    )  # fmt: skip


def test_dcp_unreadable_metadata_is_still_the_commit_marker(tmp_path: Path) -> None:
    folder = write_dcp(tmp_path / "job-1" / "step-40")
    marker = tmp_path / "marker"
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    observation = _dcp_observation(FsStore(tmp_path))
    assert observation.evidence.required == {".metadata": (folder / ".metadata").stat().st_size}
    [committed] = observe(WatchState(), [observation], T0, STALL)
    assert isinstance(committed, CheckpointCommittedV1)  # verification will judge it unsafe
    assert not marker.exists()


# -- re-driving writes the registry still holds as writing ---------------------------------------


# -- commit evidence read from files the real libraries wrote ----------------------------------


def test_a_trainer_folder_commits_on_its_state_file_only(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    folder = tmp_path / "job-hf" / "checkpoint-5"
    _save_safetensors(folder / "model.safetensors")  # complete weights: not yet a checkpoint
    found = _only(store)
    assert (found.evidence.format, found.evidence.required) == (CheckpointFormat.HF_TRAINER, None)
    write_hf_torch_files(folder)
    optimizer = (folder / "optimizer.pt").read_bytes()
    state = json.dumps({"global_step": 5, "log_history": []}, indent=2) + "\n"
    (folder / "trainer_state.json").write_text(state[:-5])  # still being written
    assert _only(store).evidence.required is None
    (folder / "trainer_state.json").write_text(state)
    (folder / "optimizer.pt").write_bytes(optimizer[:-30])  # a rank still writing its file
    found = _only(store)
    assert missing(found.evidence, found.files) == ["optimizer.pt (no zip end record yet)"]
    (folder / "optimizer.pt").write_bytes(optimizer)
    found = _only(store)
    assert (found.evidence.step, missing(found.evidence, found.files)) == (5, [])
    [committed] = observe(WatchState(), [found], T0, STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert (committed.format, committed.step) == (CheckpointFormat.HF_TRAINER, 5)


def test_sidecars_decide_before_the_format(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    prefix = "job-dcp/step-50"
    sidecar.write_intent(store, prefix, intent(step=50))
    write_dcp(tmp_path / prefix)  # .metadata is there: DCP alone would call this committed
    found = _only(store)
    assert found.evidence.format is CheckpointFormat.TORCH_DCP
    assert found.evidence.required is None
    assert found.evidence.identity == intent().identity
    assert any(sidecar.COMMIT in g for g in missing(found.evidence, found.files))

    commit = commit_for(store, prefix, 50)
    sidecar.write_commit(store, prefix, commit)
    found = _only(store)
    assert found.evidence.required == {
        **{path: e.size for path, e in commit.files.items()},
        sidecar.COMMIT: found.files[sidecar.COMMIT],
    }
    [committed] = observe(WatchState(), [found], T0, STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert (committed.step, committed.format) == (50, CheckpointFormat.TORCH_DCP)
    assert committed.identity == intent().identity
    assert committed.run_id == "run-1"
