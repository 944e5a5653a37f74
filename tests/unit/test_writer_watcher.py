"""Writer-watcher decisions from storage observations (pure), and scanning a real folder."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    FailureSide,
)
from ckpt_ha.core.records import CheckpointRecord, HistoryEntry
from ckpt_ha.formats import native, sidecar
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.storage import FsStore
from ckpt_ha.writer_watcher import adapters, domain
from ckpt_ha.writer_watcher.domain import Evidence, Observation, WatchState, missing, observe
from ckpt_ha.writer_watcher.removals import REMOVAL_GRACE
from tests.support.sidecar_tools import intent

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


def announced(
    state: WatchState, observation: Observation, at: datetime = T0
) -> CheckpointWritingV1:
    """The first scan tracks a folder; the next one, deriving the same id (its oldest file no
    longer changes), announces the write."""
    assert observe(state, [observation], at, STALL) == []
    [writing] = observe(state, [observation], at, STALL)
    assert isinstance(writing, CheckpointWritingV1)
    return writing


def test_writing_then_committed_once_complete() -> None:
    state = WatchState()
    writing = announced(state, obs({"a.bin": 10}, None))
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
    announced(state, stuck)
    assert observe(state, [stuck], T0 + timedelta(minutes=4), STALL) == []
    [failed] = observe(state, [stuck], T0 + timedelta(minutes=6), STALL)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert "stalled" in failed.reason
    assert "commit marker" in failed.reason


def test_a_write_stalled_while_storage_failed_is_the_platforms() -> None:
    state = WatchState()
    stuck = obs({"a.bin": 10}, None)
    announced(state, stuck)
    later = T0 + STALL + timedelta(seconds=1)
    trouble = (T0 + timedelta(minutes=2), "503 Slow Down")
    [failed] = observe(state, [stuck], later, STALL, None, trouble)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert failed.side is FailureSide.INFRASTRUCTURE
    assert "503 Slow Down" in failed.reason
    assert "write stalled" in failed.reason


def test_storage_trouble_before_the_last_progress_does_not_excuse_a_stall() -> None:
    state = WatchState()
    stuck = obs({"a.bin": 10}, None)
    announced(state, stuck)
    trouble = (T0 - timedelta(minutes=1), "timeout")
    [failed] = observe(state, [stuck], T0 + STALL + timedelta(seconds=1), STALL, None, trouble)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert failed.side is FailureSide.JOB


def test_a_write_noticed_only_after_an_outage_is_still_the_platforms() -> None:
    # The last file landed at T0 + 1 min; storage then failed and the watcher's scans with it,
    # so the first scan to see that file came after the outage. The write made no progress while
    # storage was failing: the stall is the platform's, not the job's.
    state = WatchState()
    announced(state, obs({"a.bin": 10}, None))
    landed = replace(obs({"a.bin": 10, "b.bin": 4}, None), last_written=T0 + timedelta(minutes=1))
    trouble = (T0 + timedelta(minutes=2), "root missing (volume not mounted?)")
    noticed = T0 + timedelta(minutes=3)
    assert observe(state, [landed], noticed, STALL, None, trouble) == []
    later = noticed + STALL + timedelta(seconds=1)
    [failed] = observe(state, [landed], later, STALL, None, trouble)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert failed.side is FailureSide.INFRASTRUCTURE


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


def test_a_write_is_announced_once_its_oldest_file_stops_changing() -> None:
    # A library writing its first file in place moves that file's time, hence the id.
    state = WatchState()
    for second in range(3):
        growing = obs({"a.bin": 10 * (second + 1)}, None, first=T0 + timedelta(seconds=second))
        assert observe(state, [growing], T0 + timedelta(seconds=second), STALL) == []
    second_file = obs({"a.bin": 30, "b.bin": 1}, None, first=T0 + timedelta(seconds=2))
    [writing] = observe(state, [second_file], T0 + timedelta(seconds=3), STALL)
    assert isinstance(writing, CheckpointWritingV1)
    required = {"a.bin": 30, "b.bin": 5}
    done = obs(dict(required), required, first=T0 + timedelta(seconds=2))
    [committed] = observe(state, [done], T0 + timedelta(seconds=4), STALL)
    assert committed.subject_key() == writing.checkpoint_id


def test_a_folder_rewritten_before_its_commit_fails_the_announced_write() -> None:
    state = WatchState()
    first = announced(state, obs({"a.bin": 10}, None))
    again = obs({"a.bin": 3}, None, first=T0 + timedelta(minutes=1))
    [failed] = observe(state, [again], T0 + timedelta(minutes=1), STALL)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert failed.checkpoint_id == first.checkpoint_id
    assert "rewritten before it was committed" in failed.reason
    [writing] = observe(state, [again], T0 + timedelta(minutes=1, seconds=2), STALL)
    assert isinstance(writing, CheckpointWritingV1)
    assert writing.checkpoint_id != first.checkpoint_id


def test_unfinished_files_are_gaps_whatever_the_sizes_say() -> None:
    evidence = Evidence(CheckpointFormat.SAFETENSORS, {"a": 5}, pending=("b (header)",))
    assert missing(evidence, {"a": 5, "b": 9}) == ["b (header)"]
    awaiting = Evidence(CheckpointFormat.HF_TRAINER, None, pending=("trainer_state.json",))
    assert missing(awaiting, {}) == ["commit marker", "trainer_state.json"]


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


def committed_state(required: dict[str, int]) -> tuple[WatchState, str]:
    state = WatchState()
    [first] = observe(state, [obs(dict(required), required)], T0, STALL)
    return state, first.subject_key()


def test_lost_shards_of_a_valid_checkpoint_are_corrupt_and_quarantined() -> None:
    required = {"a.bin": 10, "m": 5}
    state, cid = committed_state(required)
    damaged = [obs({"m": 5}, required)]
    assert domain.needs_registry(state, damaged) == [cid]

    # Short of files: maybe its writer removing it file by file; decided after the grace.
    assert (
        observe(state, damaged, T0 + timedelta(seconds=3), STALL, {cid: CheckpointState.VALID})
        == []
    )
    corrupt, quarantined = observe(
        state,
        damaged,
        T0 + timedelta(seconds=3) + REMOVAL_GRACE,
        STALL,
        {cid: CheckpointState.VALID},
    )

    assert isinstance(corrupt, CheckpointCorruptV1)
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert corrupt.side is FailureSide.INFRASTRUCTURE
    assert corrupt.reason.startswith("files missing after verification: ")
    assert corrupt.findings == ("a.bin (want 10 bytes, have none)",)
    assert quarantined.quarantine_uri is None  # filled in by whoever moves the bytes
    assert observe(state, damaged, T0 + timedelta(seconds=6), STALL) == []  # said once


@pytest.mark.parametrize("registered", [None, CheckpointState.WRITING,
                                        CheckpointState.PENDING_VERIFICATION])  # fmt: skip
def test_lost_shards_before_verification_are_a_failed_write(
    registered: CheckpointState | None,
) -> None:
    required = {"a.bin": 10, "m": 5}
    state, cid = committed_state(required)
    [failed] = observe(state, [obs({"m": 5}, required)], T0, STALL, {cid: registered})
    assert isinstance(failed, CheckpointWriteFailedV1)


@pytest.mark.parametrize(
    "registered",
    [CheckpointState.CORRUPT, CheckpointState.QUARANTINED, CheckpointState.WRITE_FAILED,
     CheckpointState.EXPIRED, CheckpointState.DELETED],
)  # fmt: skip
def test_lost_shards_of_a_decided_checkpoint_say_nothing(registered: CheckpointState) -> None:
    required = {"a.bin": 10, "m": 5}
    state, cid = committed_state(required)
    assert observe(state, [obs({"m": 5}, required)], T0, STALL, {cid: registered}) == []


def test_the_registry_is_asked_only_about_committed_folders_with_gaps() -> None:
    required = {"a.bin": 10, "m": 5}
    state, _ = committed_state(required)
    assert domain.needs_registry(state, [obs(dict(required), required)]) == []
    assert domain.needs_registry(WatchState(), [obs({"m": 5}, required)]) == []
    # The marker went first (a quarantine move in progress): no commit evidence, nothing lost.
    assert domain.needs_registry(state, [obs({"a.bin": 10}, None)]) == []
    assert observe(state, [obs({"a.bin": 10}, None)], T0, STALL) == []


def test_a_folder_removed_while_written_failed_and_a_committed_one_is_forgotten() -> None:
    state = WatchState()
    writing = announced(state, obs({"a.bin": 10}, None))
    [failed] = observe(state, [], T0 + timedelta(seconds=2), STALL)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert failed.checkpoint_id == writing.checkpoint_id
    assert failed.uri == "file:///root/job-1/step-10"
    assert "removed before it was committed" in failed.reason
    assert state.folders == {}

    # A committed one is its writer's deletion, decided after the grace (test_writer_rotation).
    state, cid = committed_state({"m": 5})
    assert observe(state, [], T0, STALL) == []
    assert observe(state, [], T0 + REMOVAL_GRACE, STALL, {cid: CheckpointState.DELETED}) == []
    assert state.folders == {}


def identity(job: str = "job-1", run: str = "run-7") -> CheckpointIdentity:
    return CheckpointIdentity(job_id=job, run_id=run, code_version="abc", project="vision")


def with_identity(ident: CheckpointIdentity | None) -> Observation:
    required = {"m": 5}
    base = obs(dict(required), required)
    return replace(base, evidence=replace(base.evidence, identity=ident))


def test_committed_carries_the_manifest_identity() -> None:
    state = WatchState()
    [committed] = observe(state, [with_identity(identity())], T0, STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert (committed.job_id, committed.run_id) == ("job-1", "run-7")
    assert committed.identity == identity()
    assert state.notes == []


def test_the_folders_job_wins_over_a_manifest_naming_another_and_that_is_noted() -> None:
    """The folder belongs to its job: a manifest naming another job claims nothing (its
    identity is not announced), a human is told."""
    state = WatchState()
    [committed] = observe(state, [with_identity(identity(job="job-real"))], T0, STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert (committed.job_id, committed.identity, committed.run_id) == ("job-1", None, "run-1")
    assert committed.checkpoint_id.startswith("job-1-")
    [note] = state.notes
    assert "'job-real'" in note
    assert "'job-1'" in note


@pytest.mark.parametrize("top", ["has space", "quarantine"])
def test_a_folder_that_is_no_jobs_is_never_announced_and_noted_once(top: str) -> None:
    required = {"m": 5}
    found = replace(obs(dict(required), required), folder=f"{top}/step-10")
    found = replace(found, evidence=replace(found.evidence, identity=identity(job="job-1")))
    state = WatchState()
    assert observe(state, [found], T0, STALL) == []
    assert observe(state, [found], T0 + timedelta(seconds=1), STALL) == []
    [note] = state.notes
    assert "not under a job's own folder" in note
    assert observe(state, [], T0 + timedelta(seconds=2), STALL) == []  # forgotten, silently
    assert state.folders == {}


def test_an_identity_that_cannot_name_a_job_falls_back_to_the_folder() -> None:
    state = WatchState()
    [committed] = observe(state, [with_identity(identity(job="has space"))], T0, STALL)
    assert isinstance(committed, CheckpointCommittedV1)
    assert (committed.job_id, committed.run_id, committed.identity) == ("job-1", "run-1", None)
    assert len(state.notes) == 1


def test_scan_reads_the_identity_and_ignores_an_invalid_one(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "job-1/step-3", {"s.bin": b"x"}, step=3, created_at=T0,
                 identity=identity(job="job-9"))  # fmt: skip
    native.write(store, "job-2/step-3", {"s.bin": b"x"}, step=3, created_at=T0)
    doc = json.loads(store.read_bytes(f"job-2/step-3/{native.MANIFEST}"))
    doc["identity"] = {"run_id": "r"}  # no job id: not an identity
    store.put(f"job-2/step-3/{native.MANIFEST}", json.dumps(doc).encode())
    found = {o.folder: o.evidence for o in adapters.scan(store)}
    assert found["job-1/step-3"].identity == identity(job="job-9")
    assert found["job-2/step-3"].identity is None
    assert found["job-2/step-3"].run_id == "r"


def test_the_quarantine_folder_is_never_watched(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "quarantine/job-1/job-1-abc", {"s.bin": b"x"}, step=1, created_at=T0)
    assert list(adapters.scan(store)) == []


def test_tracked_entries_round_trip_through_json() -> None:
    state, _ = committed_state({"a.bin": 10, "m": 5})
    [tracked] = state.folders.values()
    assert adapters.tracked_from_json(adapters.tracked_to_json(tracked)) == tracked
    failed = replace(tracked, phase="failed", failure=("write stalled", FailureSide.JOB))
    assert adapters.tracked_from_json(adapters.tracked_to_json(failed)) == failed
    # A state saved by an earlier release has no failure: read as unknown, not refused.
    doc = json.loads(adapters.tracked_to_json(failed))
    del doc["failure"]
    assert adapters.tracked_from_json(json.dumps(doc)).failure is None


# -- re-driving writes the registry still holds as writing ---------------------------------------

DEADLINE = timedelta(minutes=30)


def writing_record(
    cid: str, at: datetime = T0, uri: str = "file:///root/job-1/step-10"
) -> CheckpointRecord:
    entry = HistoryEntry(
        state=CheckpointState.WRITING, at=at, event_id="w", event_type="checkpoint.writing",
        actor="sdk",
    )  # fmt: skip
    return CheckpointRecord(
        checkpoint_id=cid, job_id="job-1", uri=uri, state=CheckpointState.WRITING,
        created_at=at, updated_at=at, history=(entry,),
    )  # fmt: skip


def test_a_commit_the_registry_missed_is_announced_again_after_the_deadline() -> None:
    complete = {"a.bin": 10, "m": 5}
    state, cid = committed_state(complete)
    seen = [obs(complete, complete)]
    record = writing_record(cid)
    early = T0 + DEADLINE - timedelta(seconds=1)
    assert domain.overdue_writes([record], state, seen, early, DEADLINE) == []
    [again] = domain.overdue_writes([record], state, seen, T0 + DEADLINE, DEADLINE)
    assert isinstance(again, CheckpointCommittedV1)
    assert (again.checkpoint_id, again.shard_count) == (cid, 2)


def test_a_failure_the_registry_missed_is_announced_again_with_its_reason_and_side() -> None:
    state = WatchState()
    stuck = obs({"a.bin": 10}, None)
    writing = announced(state, stuck)
    [failed] = observe(state, [stuck], T0 + timedelta(minutes=6), STALL)
    assert isinstance(failed, CheckpointWriteFailedV1)
    later = T0 + DEADLINE
    [again] = domain.overdue_writes([writing_record(writing.checkpoint_id)], state, [stuck],
                                    later, DEADLINE)  # fmt: skip
    assert isinstance(again, CheckpointWriteFailedV1)
    assert (again.reason, again.side) == (failed.reason, failed.side)


def test_a_write_the_watcher_still_follows_is_left_to_the_stall_timeout() -> None:
    state = WatchState()
    growing = obs({"a.bin": 10}, None)
    writing = announced(state, growing)
    record = writing_record(writing.checkpoint_id)
    assert domain.overdue_writes([record], state, [growing], T0 + DEADLINE, DEADLINE) == []


def test_a_write_no_folder_holds_any_more_fails_after_the_deadline() -> None:
    """The writer announced it and died before the watcher ever settled the folder (or the
    folder was removed or written again under another id): it can never complete."""
    record = writing_record("job-1-gone")
    [failed] = domain.overdue_writes([record], WatchState(), [], T0 + DEADLINE, DEADLINE)
    assert isinstance(failed, CheckpointWriteFailedV1)
    assert (failed.checkpoint_id, failed.uri) == ("job-1-gone", record.uri)
    assert failed.reason.startswith("write never completed")
    assert failed.side is FailureSide.UNKNOWN


def test_only_writing_records_are_re_driven() -> None:
    moved = writing_record("job-1-x").model_copy(update={"state": CheckpointState.WRITE_FAILED})
    assert domain.overdue_writes([moved], WatchState(), [], T0 + 9 * DEADLINE, DEADLINE) == []


# -- commit evidence read from files the real libraries wrote ----------------------------------


def _only(store: FsStore) -> Observation:
    [found] = list(adapters.scan(store))
    return found


def _save_safetensors(path: Path) -> bytes:
    import numpy as np
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.ones((64, 16), dtype=np.float32), "b": np.zeros(3, np.int64)}, str(path))
    return path.read_bytes()


def test_a_safetensors_file_counts_complete_only_at_its_declared_size(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    path = tmp_path / "job-1" / "weights" / "model.safetensors"
    data = _save_safetensors(path)
    header_end = 8 + int.from_bytes(data[:8], "little")
    for cut, gap in [(5, "header not all written"), (header_end - 1, "header not all written"),
                     (header_end + 10, f"want {len(data)} bytes")]:  # fmt: skip
        path.write_bytes(data[:cut])
        found = _only(store)
        assert found.evidence.format is CheckpointFormat.SAFETENSORS
        assert any(gap in g for g in missing(found.evidence, found.files)), cut
    path.write_bytes(data)
    found = _only(store)
    assert found.evidence.required == {"model.safetensors": len(data)}
    assert missing(found.evidence, found.files) == []


def test_safetensors_shards_without_their_index_are_a_save_in_progress(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    folder = tmp_path / "job-1" / "final"
    one = _save_safetensors(folder / "model-00001-of-00002.safetensors")
    found = _only(store)
    assert found.evidence.required is None
    assert "written after the shards" in " ".join(missing(found.evidence, found.files))
    index = {"weight_map": {"w": "model-00001-of-00002.safetensors",
                            "x": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    found = _only(store)
    assert missing(found.evidence, found.files) == [
        "model-00002-of-00002.safetensors (not written yet)"
    ]
    (folder / "model-00002-of-00002.safetensors").write_bytes(one)
    assert missing(_only(store).evidence, _only(store).files) == []


def test_trainer_only_files_make_a_trainer_folder_whatever_its_name(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    folder = tmp_path / "job-hf" / "last"
    _save_safetensors(folder / "model.safetensors")
    (folder / "optimizer.pt").write_bytes(b"")
    found = _only(store)
    assert (found.evidence.format, found.evidence.required) == (CheckpointFormat.HF_TRAINER, None)


def test_unreadable_sidecars(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    store.put("job-1/a/ckpt-ha.identity.json", b"{not json")
    store.put("job-1/a/__0_0.distcp", b"x")
    store.put("job-1/a/.metadata", b"x")
    store.put("job-1/b/ckpt-ha.identity.json", sidecar.encode(intent()))
    store.put("job-1/b/ckpt-ha.commit.json", b'{"schema_version":9}')
    found = {o.folder: o.evidence for o in adapters.scan(store)}
    # An intent, readable or not, says a commit file will follow.
    assert found["job-1/a"].required is None
    # A commit file that cannot be read is still the commit marker: verification judges it.
    assert found["job-1/b"].required == {sidecar.COMMIT: 20}
