"""Writer-watcher decisions from storage observations (pure), and scanning a real folder."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path

from contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
)
from services.shared.formats import native
from services.shared.formats.identity import checkpoint_id_on
from services.shared.storage import FsStore
from services.writer_watcher import adapters
from services.writer_watcher.domain import Evidence, Observation, WatchState, missing, observe
from tests.support.torch_tools import Payload, write_dcp

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)


def obs(
    files: dict[str, int], required: dict[str, int] | None, first: datetime = T0
) -> Observation:
    return Observation(
        folder="job-1/step-10",
        uri="file:///root/job-1/step-10",
        files=files,
        first_written=first,
        last_written=first,
        evidence=Evidence(CheckpointFormat.NATIVE if required else CheckpointFormat.UNKNOWN,
                          required, step=10, run_id="run-1"),
    )  # fmt: skip


def test_writing_then_committed_once_complete() -> None:
    state = WatchState()
    [writing] = observe(state, [obs({"a.bin": 10}, None)], T0, STALL)
    assert isinstance(writing, CheckpointWritingV1)
    # The manifest appeared but a listed shard is still short: not committed.
    partial = obs({"a.bin": 10, "b.bin": 3, "m": 5}, {"a.bin": 10, "b.bin": 7, "m": 5})
    assert observe(state, [partial], T0 + timedelta(seconds=2), STALL) == []
    complete = obs({"a.bin": 10, "b.bin": 7, "m": 5}, {"a.bin": 10, "b.bin": 7, "m": 5})
    [committed] = observe(state, [complete], T0 + timedelta(seconds=4), STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert committed.checkpoint_id == writing.checkpoint_id
    assert (committed.step, committed.run_id, committed.shard_count) == (10, "run-1", 3)
    assert observe(state, [complete], T0 + timedelta(seconds=6), STALL) == []  # said once


def test_stalled_write_fails_and_says_what_is_missing() -> None:
    state = WatchState()
    stuck = obs({"a.bin": 10}, None)
    observe(state, [stuck], T0, STALL)
    assert observe(state, [stuck], T0 + timedelta(minutes=4), STALL) == []
    [failed] = observe(state, [stuck], T0 + timedelta(minutes=6), STALL)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert "stalled" in failed.reason
    assert "commit marker" in failed.reason


def test_progress_resets_the_stall_clock() -> None:
    state = WatchState()
    observe(state, [obs({"a.bin": 10}, None)], T0, STALL)
    observe(state, [obs({"a.bin": 20}, None)], T0 + timedelta(minutes=4), STALL)
    assert observe(state, [obs({"a.bin": 20}, None)], T0 + timedelta(minutes=8), STALL) == []


def test_shard_lost_after_commit_is_a_failed_write() -> None:
    state = WatchState()
    required = {"a.bin": 10, "m": 5}
    observe(state, [obs({"a.bin": 10, "m": 5}, required)], T0, STALL)
    [failed] = observe(state, [obs({"m": 5}, required)], T0 + timedelta(seconds=3), STALL)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert "after commit" in failed.reason


def test_rewriting_the_same_path_is_a_new_checkpoint() -> None:
    state = WatchState()
    required = {"a.bin": 10, "m": 5}
    [first] = observe(state, [obs({"a.bin": 10, "m": 5}, required)], T0, STALL)
    later = T0 + timedelta(hours=2)
    [second] = observe(state, [obs({"a.bin": 10, "m": 5}, required, first=later)], later, STALL)
    assert first.subject_key() != second.subject_key()


def test_scan_reads_commit_evidence_from_storage(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "job-1/step-3", {"s.bin": b"x" * 50}, step=3, created_at=T0)
    store.put("job-2/partial/s.bin", b"y" * 10)
    store.put("loose-file.txt", b"ignored")
    found = {o.folder: o for o in adapters.scan(store)}
    assert set(found) == {"job-1/step-3", "job-2/partial"}
    assert found["job-1/step-3"].evidence.required == {native.MANIFEST: found[
        "job-1/step-3"].files[native.MANIFEST], "s.bin": 50}  # fmt: skip
    assert found["job-1/step-3"].evidence.step == 3
    assert found["job-2/partial"].evidence.required is None


def test_writer_and_watcher_derive_the_same_id(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "job-1/step-3", {"s.bin": b"x" * 50}, step=3, created_at=T0)
    [committed] = observe(WatchState(), list(adapters.scan(store)), T0, STALL)
    assert committed.subject_key() == checkpoint_id_on(store, "job-1/step-3")


def test_minimum_sizes_count_a_longer_file_as_present() -> None:
    evidence = Evidence(
        CheckpointFormat.TORCH_DCP,
        {".metadata": 5, "d.distcp": 100},
        at_least=frozenset({"d.distcp"}),
    )
    assert missing(evidence, {".metadata": 5, "d.distcp": 120}) == []
    assert missing(evidence, {".metadata": 5, "d.distcp": 100}) == []
    assert missing(evidence, {".metadata": 5, "d.distcp": 99}) == [
        "d.distcp (want at least 100 bytes, have 99)"
    ]
    assert missing(evidence, {".metadata": 6, "d.distcp": 100}) == [
        ".metadata (want 5 bytes, have 6)"
    ]


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
    [writing] = observe(state, [_dcp_observation(store)], T0, STALL)
    assert isinstance(writing, CheckpointWritingV1)
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
