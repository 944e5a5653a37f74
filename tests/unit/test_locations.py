"""Who owns a storage location, and what removing one may touch (`ckpt_ha.core.locations`)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
)
from ckpt_ha.core.locations import (
    QUARANTINE,
    Neighbour,
    folder_job,
    intake_refusal,
    job_folder,
    not_owned,
    plan_removal,
    quarantine_not_owned,
)
from ckpt_ha.sdk import folder_for
from ckpt_ha.storage import FsStore, key_for_uri, keys_in
from ckpt_ha.storage.quarantine import TOP, quarantine_key

ROOT = "file:///root/"


def key_of(uri: str) -> str | None:
    """`key_for_uri` for a store rooted at /root, without the store."""
    return uri[len(ROOT) :].rstrip("/") or None if uri.startswith(ROOT) else None


@pytest.mark.parametrize("job", ["job-1", "a.b", "J_2", "x" * 200])
def test_a_job_id_that_is_one_safe_component_is_its_own_folder(job: str) -> None:
    assert job_folder(job) == job


@pytest.mark.parametrize(
    "job", ["", ".", "..", "a/b", "a\\b", "has space", "tab\there", "nul\x00", QUARANTINE]
)
def test_a_job_id_that_is_not_one_safe_component_owns_no_location(job: str) -> None:
    assert job_folder(job) is None
    assert not_owned(job, f"{job}/step-1") is not None


def test_the_sdk_writes_a_job_into_the_folder_the_rule_gives_it() -> None:
    assert folder_for("job-1", 3).split("/")[0] == job_folder("job-1")
    assert TOP == QUARANTINE
    assert quarantine_key("job-1", "c1").startswith(f"{QUARANTINE}/job-1/")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("victim/step-1", "not in the job's own folder"),
        ("victim", "not in the job's own folder"),
        ("evil", "the job's folder 'evil' itself"),
        ("evil/../victim/step-1", "not a plain relative path"),
        ("evil//step-1", "not a plain relative path"),
        ("evil/./step-1", "not a plain relative path"),
        (None, "outside the storage root"),
        (f"{QUARANTINE}/evil/c1", "not in the job's own folder"),
    ],
)
def test_a_location_outside_the_jobs_own_folder_is_not_its(key: str | None, why: str) -> None:
    found = not_owned("evil", key)
    assert found is not None
    assert why in found


@pytest.mark.parametrize("key", ["evil/step-1", "evil/step-1/sub", "evil/checkpoint-10"])
def test_a_location_under_the_jobs_own_folder_is_its(key: str) -> None:
    assert not_owned("evil", key) is None
    assert folder_job(key) == "evil"


def test_quarantined_bytes_lie_under_the_jobs_own_quarantine_folder() -> None:
    assert quarantine_not_owned("evil", f"{QUARANTINE}/evil/c1") is None
    for key in (f"{QUARANTINE}/victim/c1", f"{QUARANTINE}/evil", "evil/c1", "victim/step-1"):
        assert quarantine_not_owned("evil", key) is not None
    assert folder_job(f"{QUARANTINE}/evil/c1") is None  # nobody's checkpoint folder


def test_the_rule_reads_keys_as_the_store_derives_them() -> None:
    store = FsStore("/root")
    assert not_owned("evil", key_for_uri(store, store.uri("evil/step-1"))) is None
    # Percent-encoding and dot segments cannot walk into another job's folder.
    assert not_owned("evil", key_for_uri(store, "file:///root/evil/%2E%2E/victim/s")) is not None
    assert not_owned("evil", key_for_uri(store, "file:///elsewhere/evil/step-1")) is not None


def _committed(job: str, uri: str) -> CheckpointCommittedV1:
    return CheckpointCommittedV1(
        job_id=job, checkpoint_id="c", uri=uri, run_id="r", step=1,
        format=CheckpointFormat.NATIVE,
    )  # fmt: skip


def test_intake_refuses_a_creator_at_another_jobs_location() -> None:
    refuse = partial(intake_refusal, key_of=key_of)
    assert refuse(_committed("evil", f"{ROOT}evil/step-1")) is None
    for uri in (f"{ROOT}victim/step-1", f"{ROOT}victim", f"{ROOT}evil", "s3://b/evil/step-1"):
        refused = refuse(_committed("evil", uri))
        assert refused is not None
        assert (refused.code, refused.job_id, refused.uri) == ("location_not_owned", "evil", uri)
    writing = CheckpointWritingV1(
        job_id="evil", checkpoint_id="c", uri=f"{ROOT}victim/s", run_id="r"
    )
    failed = CheckpointWriteFailedV1(
        job_id="evil", checkpoint_id="c", uri=f"{ROOT}victim/s", reason="x"
    )
    assert refuse(writing) is not None
    assert refuse(failed) is not None


def test_intake_refuses_a_quarantine_copy_outside_the_jobs_quarantine_folder() -> None:
    refuse = partial(intake_refusal, key_of=key_of)
    base = {"job_id": "evil", "checkpoint_id": "c", "uri": f"{ROOT}evil/s", "reason": "r"}
    ok = CheckpointQuarantinedV1(**base, quarantine_uri=f"{ROOT}quarantine/evil/c")
    assert refuse(ok) is None
    assert refuse(CheckpointQuarantinedV1(**base)) is None
    bad = CheckpointQuarantinedV1(**base, quarantine_uri=f"{ROOT}victim/step-1")
    assert refuse(bad) is not None
    release = CheckpointReleasedV1(**base, actor="a", quarantine_uri=f"{ROOT}quarantine/v/c")
    assert refuse(release) is not None


def test_intake_leaves_events_about_existing_records_to_the_projection() -> None:
    """An expiry's uri is display only: the projection checks its job against the record's."""
    expired = CheckpointExpiredV1(
        job_id="evil", checkpoint_id="c", uri="file:///x", reason="r", policy="p"
    )
    assert intake_refusal(expired, key_of) is None


# --- removal ----------------------------------------------------------------------------------

N = Neighbour


def test_removal_of_a_location_nobody_else_uses_takes_everything() -> None:
    removal = plan_removal("j/a", [N("x", "j/b"), N("y", "j/ab"), N("z", "k/a")])
    assert removal.whole
    assert removal.note() == ""
    assert removal.removes("j/a/f")
    assert removal.removes("j/a")
    assert not removal.removes("j/ab/f")


def test_removal_at_another_live_records_location_takes_nothing() -> None:
    removal = plan_removal("j/a", [N("new", "j/a")])
    assert removal.blocked_by == N("new", "j/a")
    assert not removal.removes("j/a/f")
    assert "live checkpoint new is at the same location" in removal.note()


def test_removal_inside_another_live_records_folder_takes_nothing() -> None:
    removal = plan_removal("j/a/b", [N("outer", "j/a")])
    assert removal.blocked_by == N("outer", "j/a")
    assert not removal.removes("j/a/b/f")


def test_removal_around_other_live_records_spares_their_subtrees() -> None:
    removal = plan_removal("j", [N("n2", "j/b"), N("n1", "j/a")])
    assert [n.checkpoint_id for n in removal.spared] == ["n1", "n2"]
    assert removal.removes("j/x.bin")
    assert removal.removes("j/ab/x.bin")  # a sibling named like a spared folder still goes
    assert not removal.removes("j/a/x.bin")
    assert not removal.removes("j/b/deep/x.bin")
    assert "j/a (checkpoint n1)" in removal.note()


@pytest.mark.parametrize(
    "uri",
    [
        "file:///root/job-1/step-1",
        "file:///root/job-1/step-1/",
        "file:///root/a%20b/step-1",
        "file:///root/",
        "file:///root",
        "file:///rooted/job-1/step-1",
        "s3://bucket/job-1/step-1",
    ],
)
def test_keys_in_a_store_are_what_key_for_uri_says(tmp_path: Path, uri: str) -> None:
    """`keys_in` works the root out once; every answer is `key_for_uri`'s."""
    store = FsStore(tmp_path / "root")
    moved = uri.replace("file:///root", store.uri("x")[: -len("/x")])
    assert keys_in(store)(moved) == key_for_uri(store, moved)
