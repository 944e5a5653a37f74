"""A framework rotating its own checkpoints is no damage (issue 28, deliverable 3): a committed
folder its writer removes is recorded as deleted by the job, never corrupt or quarantined. A
rotation never removes the job's newest checkpoint: a folder gone while no newer one of its job
is committed is a loss, left to the scrub (`ckpt_ha.core.rotation`)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointState,
    CheckpointWriteFailedV1,
)
from ckpt_ha.core.lifecycle import transition
from ckpt_ha.writer_watcher import domain
from ckpt_ha.writer_watcher.adapters import tracked_from_json, tracked_to_json
from ckpt_ha.writer_watcher.domain import Evidence, Observation, WatchState, observe
from ckpt_ha.writer_watcher.removals import REMOVAL_GRACE

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)
REQUIRED = {"model.safetensors": 10, "trainer_state.json": 5}


def obs(files: dict[str, int], folder: str = "job-1/checkpoint-10", step: int = 10) -> Observation:
    return Observation(
        folder=folder,
        uri=f"file:///root/{folder}",
        files=files,
        first_written=T0 + timedelta(seconds=step),
        last_written=T0 + timedelta(seconds=step),
        evidence=Evidence(CheckpointFormat.HF_TRAINER, REQUIRED, step=step, run_id="run-1"),
    )


NEWER = obs(dict(REQUIRED), "job-1/checkpoint-20", step=20)
"""The checkpoint the Trainer wrote before rotating checkpoint-10 away: it stays."""


def committed(*others: Observation) -> tuple[WatchState, str]:
    """checkpoint-10 committed beside ``others`` (default: the newer checkpoint-20)."""
    state = WatchState()
    first, *_ = observe(state, [obs(dict(REQUIRED)), *(others or (NEWER,))], T0, STALL)
    return state, first.subject_key()


def test_a_valid_folder_removed_as_a_whole_is_deleted_by_its_writer() -> None:
    state, cid = committed()
    at = T0 + timedelta(seconds=5)
    assert observe(state, [NEWER], at, STALL) == []  # gone: decided after the grace
    assert domain.needs_registry(state, []) == [cid]
    assert (
        observe(state, [NEWER], at + timedelta(seconds=1), STALL, {cid: CheckpointState.VALID})
        == []
    )
    expired, deleted = observe(
        state, [NEWER], at + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID}
    )
    assert isinstance(expired, CheckpointExpiredV1)
    assert isinstance(deleted, CheckpointDeletedV1)
    assert (deleted.actor, deleted.policy, deleted.objects_deleted) == (
        "job:job-1", "writer-rotation", 0,
    )  # fmt: skip
    assert "deleted by its writer" in deleted.reason
    assert deleted.checkpoint_id == cid
    assert deleted.uri == "file:///root/job-1/checkpoint-10"
    assert list(state.folders) == ["job-1/checkpoint-20"]
    # The registry's lifecycle takes it: valid → expired → deleted (a tombstone, R6).
    assert transition(cid, CheckpointState.VALID, CheckpointState.EXPIRED).changed
    assert transition(cid, CheckpointState.EXPIRED, CheckpointState.DELETED).changed


def test_a_removal_seen_half_way_is_never_damage() -> None:
    """``shutil.rmtree`` removes file by file: a scan may see the folder short of files."""
    state, cid = committed()
    half = [obs({"trainer_state.json": 5}), NEWER]
    assert domain.needs_registry(state, half) == [cid]
    at = T0 + timedelta(seconds=2)
    assert observe(state, half, at, STALL, {cid: CheckpointState.VALID}) == []
    assert state.folders["job-1/checkpoint-10"].phase == "vanishing"
    assert (
        observe(state, [NEWER], at + timedelta(seconds=3), STALL, {cid: CheckpointState.VALID})
        == []
    )
    events = observe(state, [NEWER], at + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID})
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
        observe(state, [NEWER], T0, STALL)
        events = observe(state, [NEWER], T0 + REMOVAL_GRACE, STALL, {cid: registered})
        assert [type(e) for e in events] == expected, registered
        assert list(state.folders) == ["job-1/checkpoint-20"]


def test_a_gone_folder_waits_for_the_registrys_answer_and_a_full_scan_keeps_its_clock() -> None:
    state, cid = committed()
    observe(state, [NEWER], T0, STALL)
    assert observe(state, [NEWER], T0 + 2 * REMOVAL_GRACE, STALL) == []  # not asked: not decided
    observe(state, [], T0 + REMOVAL_GRACE, STALL, vanished={"job-1/checkpoint-10"})
    assert state.folders["job-1/checkpoint-10"].last_change == T0
    events = observe(state, [NEWER], T0 + 2 * REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID})
    assert len(events) == 2


def test_a_folder_whole_again_is_committed_again_without_an_event() -> None:
    state, cid = committed()
    observe(state, [obs({"trainer_state.json": 5})], T0, STALL, {cid: CheckpointState.VALID})
    assert observe(state, [obs(dict(REQUIRED))], T0 + REMOVAL_GRACE, STALL) == []
    assert state.folders["job-1/checkpoint-10"].phase == "committed"


def test_the_jobs_newest_gone_too_is_a_loss_never_a_deletion() -> None:
    """A wiped disk or a deleted prefix takes every folder: no rotation removes the newest."""
    state, cid = committed()
    newer_cid = state.folders["job-1/checkpoint-20"].checkpoint_id
    observe(state, [], T0, STALL)
    assert sorted(domain.needs_registry(state, [])) == sorted([cid, newer_cid])
    valid = {cid: CheckpointState.VALID, newer_cid: CheckpointState.VALID}
    assert observe(state, [], T0 + REMOVAL_GRACE, STALL, valid) == []  # left to the scrub
    assert state.folders == {}


def test_a_lone_checkpoint_removed_is_a_loss_and_another_jobs_newer_one_does_not_count() -> None:
    other_job = obs(dict(REQUIRED), "job-2/checkpoint-20", step=20)
    state, cid = committed(other_job)
    observe(state, [other_job], T0, STALL)
    assert (
        observe(state, [other_job], T0 + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID}) == []
    )
    assert list(state.folders) == ["job-2/checkpoint-20"]


def test_an_older_checkpoint_left_does_not_make_the_newest_gone_a_rotation() -> None:
    older = obs(dict(REQUIRED), "job-1/checkpoint-5", step=5)
    state, cid = committed(older)
    observe(state, [older], T0, STALL)
    assert observe(state, [older], T0 + REMOVAL_GRACE, STALL, {cid: CheckpointState.VALID}) == []


def test_a_newer_checkpoint_still_being_written_defers_the_decision() -> None:
    """The Trainer removes the old folder inside its save, before the new one is committed."""
    writing = obs({"model.safetensors": 3}, "job-1/checkpoint-20", step=20)
    state, cid = committed(writing)
    observe(state, [writing], T0 + timedelta(seconds=1), STALL)
    assert state.folders["job-1/checkpoint-20"].phase == "writing"
    later = T0 + 2 * REMOVAL_GRACE
    assert observe(state, [writing], later, STALL, {cid: CheckpointState.VALID}) == []
    assert state.folders["job-1/checkpoint-10"].phase == "gone"  # not decided yet
    events = observe(state, [NEWER], later, STALL, {cid: CheckpointState.VALID})
    assert [type(e) for e in events][-2:] == [CheckpointExpiredV1, CheckpointDeletedV1]


def test_the_step_a_committed_folder_declares_survives_a_restart() -> None:
    state, _ = committed()
    known = state.folders["job-1/checkpoint-20"]
    assert known.step == 20
    assert tracked_from_json(tracked_to_json(known)) == known
    legacy = json.loads(tracked_to_json(known))
    del legacy["step"], legacy["written"]  # saved by an earlier release
    assert tracked_from_json(json.dumps(legacy)) == replace(known, step=None, written=None)


def test_a_checkpoint_written_after_the_loss_does_not_make_it_a_rotation() -> None:
    """The job restored from a copy after its storage was wiped writes its next checkpoint
    within the grace: it came after the folders went, so they stay a loss."""
    state, cid = committed(obs(dict(REQUIRED), "job-1/checkpoint-5", step=5))
    older = state.folders["job-1/checkpoint-5"].checkpoint_id
    observe(state, [], T0 + timedelta(seconds=1), STALL)  # both gone: a wiped storage
    [restored] = observe(state, [NEWER], T0 + timedelta(seconds=5), STALL)
    assert isinstance(restored, CheckpointCommittedV1)
    valid = {cid: CheckpointState.VALID, older: CheckpointState.VALID}
    assert observe(state, [NEWER], T0 + REMOVAL_GRACE * 2, STALL, valid) == []
    assert list(state.folders) == ["job-1/checkpoint-20"]
