"""A framework rotating its own checkpoints is no damage (issue 28, deliverable 3): a committed
folder its writer removes is recorded as deleted by the job, never corrupt or quarantined."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ckpt_ha.contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointState,
    CheckpointWriteFailedV1,
)
from ckpt_ha.core.lifecycle import transition
from ckpt_ha.writer_watcher import domain
from ckpt_ha.writer_watcher.domain import Evidence, Observation, WatchState, observe
from ckpt_ha.writer_watcher.removals import REMOVAL_GRACE

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)
REQUIRED = {"model.safetensors": 10, "trainer_state.json": 5}


def obs(files: dict[str, int], folder: str = "job-1/checkpoint-10") -> Observation:
    return Observation(
        folder=folder,
        uri=f"file:///root/{folder}",
        files=files,
        first_written=T0,
        last_written=T0,
        evidence=Evidence(CheckpointFormat.HF_TRAINER, REQUIRED, step=10, run_id="run-1"),
    )


def committed() -> tuple[WatchState, str]:
    state = WatchState()
    [first] = observe(state, [obs(dict(REQUIRED))], T0, STALL)
    return state, first.subject_key()


def test_a_valid_folder_removed_as_a_whole_is_deleted_by_its_writer() -> None:
    state, cid = committed()
    at = T0 + timedelta(seconds=5)
    assert observe(state, [], at, STALL) == []  # gone: decided after the grace
    assert domain.needs_registry(state, []) == [cid]
    assert observe(state, [], at + timedelta(seconds=1), STALL, {cid: CheckpointState.VALID}) == []
    expired, deleted = observe(state, [], at + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID})
    assert isinstance(expired, CheckpointExpiredV1)
    assert isinstance(deleted, CheckpointDeletedV1)
    assert (deleted.actor, deleted.policy, deleted.objects_deleted) == (
        "job:job-1", "writer-rotation", 0,
    )  # fmt: skip
    assert "deleted by its writer" in deleted.reason
    assert deleted.checkpoint_id == cid
    assert deleted.uri == "file:///root/job-1/checkpoint-10"
    assert state.folders == {}
    # The registry's lifecycle takes it: valid → expired → deleted (a tombstone, R6).
    assert transition(cid, CheckpointState.VALID, CheckpointState.EXPIRED).changed
    assert transition(cid, CheckpointState.EXPIRED, CheckpointState.DELETED).changed


def test_a_removal_seen_half_way_is_never_damage() -> None:
    """``shutil.rmtree`` removes file by file: a scan may see the folder short of files."""
    state, cid = committed()
    half = [obs({"trainer_state.json": 5})]
    assert domain.needs_registry(state, half) == [cid]
    at = T0 + timedelta(seconds=2)
    assert observe(state, half, at, STALL, {cid: CheckpointState.VALID}) == []
    assert state.folders["job-1/checkpoint-10"].phase == "vanishing"
    assert observe(state, [], at + timedelta(seconds=3), STALL, {cid: CheckpointState.VALID}) == []
    events = observe(state, [], at + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID})
    assert [type(e) for e in events] == [CheckpointExpiredV1, CheckpointDeletedV1]


def test_lost_files_of_a_folder_that_stays_are_still_damage() -> None:
    state, cid = committed()
    damaged = [obs({"trainer_state.json": 5})]
    assert observe(state, damaged, T0, STALL, {cid: CheckpointState.VALID}) == []
    assert observe(state, damaged, T0 + timedelta(seconds=5), STALL,
                   {cid: CheckpointState.VALID}) == []  # fmt: skip
    corrupt, _quarantined = observe(
        state, damaged, T0 + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID}
    )
    assert isinstance(corrupt, CheckpointCorruptV1)


def test_the_platforms_own_removals_and_unverified_ones_are_not_the_writers() -> None:
    for registered, expected in [
        (CheckpointState.QUARANTINED, []),  # a quarantine move emptied it
        (CheckpointState.CORRUPT, []),
        (CheckpointState.EXPIRED, []),  # retention deletes it and records that itself
        (CheckpointState.DELETED, []),
        (CheckpointState.PENDING_VERIFICATION, [CheckpointWriteFailedV1]),
    ]:
        state, cid = committed()
        observe(state, [], T0, STALL)
        events = observe(state, [], T0 + REMOVAL_GRACE, STALL, {cid: registered})
        assert [type(e) for e in events] == expected, registered
        assert state.folders == {}


def test_a_gone_folder_waits_for_the_registrys_answer_and_a_full_scan_keeps_its_clock() -> None:
    state, cid = committed()
    observe(state, [], T0, STALL)
    assert observe(state, [], T0 + 2 * REMOVAL_GRACE, STALL) == []  # not asked: not decided
    observe(state, [], T0 + REMOVAL_GRACE, STALL, vanished={"job-1/checkpoint-10"})
    assert state.folders["job-1/checkpoint-10"].last_change == T0
    events = observe(state, [], T0 + 2 * REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID})
    assert len(events) == 2


def test_a_folder_whole_again_is_committed_again_without_an_event() -> None:
    state, cid = committed()
    observe(state, [obs({"trainer_state.json": 5})], T0, STALL, {cid: CheckpointState.VALID})
    assert observe(state, [obs(dict(REQUIRED))], T0 + REMOVAL_GRACE, STALL) == []
    assert state.folders["job-1/checkpoint-10"].phase == "committed"
