"""Pure registrar and operator decisions: identity binding, location conflicts, ownership,
quarantine and release."""

from __future__ import annotations

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointConflictV1,
    CheckpointQuarantinedV1,
    CheckpointRegisteredV1,
    CheckpointState,
    OwnershipTransferredV1,
)
from ckpt_ha.core.job_records import OwnershipMismatch, own
from ckpt_ha.core.records import Applied, CheckpointRecord, project
from ckpt_ha.ops import actions
from ckpt_ha.registrar.domain import follow_ups
from tests.support.events import T0, committed, verified


def valid_record(project_name: str | None = "vision") -> CheckpointRecord:
    record, _ = project(None, committed("c1", project=project_name))
    record, _ = project(record, verified("c1"))
    assert record is not None
    assert record.state is CheckpointState.VALID
    return record


def test_registered_carries_the_bound_identity_and_project() -> None:
    record = valid_record()
    [event] = follow_ups(verified("c1"), Applied(record, None, duplicate=False, owner="vision"))
    assert isinstance(event, CheckpointRegisteredV1)
    assert event.project == "vision"
    assert event.identity is not None
    assert (event.identity.job_id, event.identity.run_id) == ("job-1", "run-1")
    assert event.identity.code_version == "abc123"


def test_identity_without_a_declaration_is_what_the_registry_knows() -> None:
    record = valid_record(project_name=None)
    [event] = follow_ups(verified("c1"), Applied(record, None, duplicate=False, owner="nlp"))
    assert isinstance(event, CheckpointRegisteredV1)
    assert event.identity is not None
    assert event.identity.run_id == "run-1"
    assert event.identity.created_at == record.created_at
    assert event.project == "nlp"  # the job's owner, claimed by an earlier checkpoint


def test_a_second_id_at_one_location_is_a_conflict() -> None:
    record, _ = project(None, committed("c2"))
    assert record is not None
    [event] = follow_ups(
        committed("c2"), Applied(record, None, duplicate=False, others_at_uri=("c0", "c1"))
    )
    assert isinstance(event, CheckpointConflictV1)
    assert event.existing_checkpoint_id == "c1"
    assert "c0, c1" in event.reason
    assert follow_ups(committed("c2"), Applied(record, None, duplicate=False)) == []


def test_a_late_commit_binds_identity_without_moving_the_lifecycle() -> None:
    record, _ = project(None, committed("c1"))
    record, _ = project(record, verified("c1"))
    assert record is not None
    assert record.identity is None
    later, step = project(record, committed("c1", project="vision", key="sdk"))
    assert step is not None
    assert not step.changed
    assert later is not None
    assert later.state is CheckpointState.VALID
    assert later.identity is not None
    assert later.identity.project == "vision"
    assert later.history == record.history


def transfer(from_project: str | None, to: str) -> Envelope[EventData]:
    return build(
        OwnershipTransferredV1(
            job_id="job-1", from_project=from_project, to_project=to, reason="r", actor="a"
        ),
        source="ckpt-ha/cli",
        time=T0,
        key=f"{from_project}-{to}",
    )


def test_ownership_is_claimed_once_then_moves_only_by_transfer() -> None:
    record = valid_record()
    claim = own(None, committed("c1", project="vision"), record)
    assert claim is not None
    assert (claim.from_project, claim.to_project) == (None, "vision")
    assert own("vision", committed("c1", project="other"), record) is None
    moved = own("vision", transfer("vision", "nlp"), None)
    assert moved is not None
    assert (moved.from_project, moved.to_project, moved.actor) == ("vision", "nlp", "a")
    with pytest.raises(OwnershipMismatch) as info:
        own("nlp", transfer("vision", "x"), None)
    assert info.value.code == "ownership_mismatch"
    assert "owned by nlp" in str(info.value)


def test_operator_actions_follow_the_lifecycle() -> None:
    record = valid_record()
    event = actions.quarantine(record, "loss spike", "alice")
    assert (event.actor, event.reason, event.checkpoint_id) == ("alice", "loss spike", "c1")
    with pytest.raises(actions.ActionRefused, match="not quarantined"):
        actions.release(record, "fine", "bob")
    quarantined, _ = project(record, build(event, source="ckpt-ha/cli", time=T0, key="q"))
    assert quarantined is not None
    assert quarantined.history[-1].actor == "alice"
    with pytest.raises(actions.ActionRefused, match="already quarantined"):
        actions.quarantine(quarantined, "again", "alice")
    released = actions.release(quarantined, "checked by hand", "bob")
    assert released.actor == "bob"
    # Quarantined automatically (a failed load): a person may keep it quarantined after a look.
    auto = build(CheckpointQuarantinedV1(job_id=record.job_id, checkpoint_id="c1", uri=record.uri,
                                         reason="load failed"),
                 source="ckpt-ha/integrity-checker", time=T0, key="auto")  # fmt: skip
    isolated, _ = project(record, auto)
    assert isolated is not None
    kept = actions.quarantine(isolated, "reviewed: the shard is really damaged", "carol")
    assert (kept.actor, kept.checkpoint_id) == ("carol", "c1")
    reviewed, _ = project(isolated, build(kept, source="ckpt-ha/cli", time=T0, key="kept"))
    assert reviewed is not None
    with pytest.raises(actions.ActionRefused, match="already quarantined"):
        actions.quarantine(reviewed, "again", "carol")
    pending, _ = project(None, committed("c9"))
    assert pending is not None
    with pytest.raises(actions.ActionRefused, match="pending_verification"):
        actions.quarantine(pending, "x", "alice")


def test_transfers_name_the_owner_seen_and_refuse_others() -> None:
    events = actions.transfer({"j1": "a", "j2": "a"}, "a", "b", "reorg", "carol")
    assert [(e.job_id, e.from_project, e.to_project) for e in events] == [
        ("j1", "a", "b"),
        ("j2", "a", "b"),
    ]
    with pytest.raises(actions.ActionRefused, match="not owned by a: j2 \\(c\\)"):
        actions.transfer({"j1": "a", "j2": "c"}, "a", "b", "r", "carol")
    with pytest.raises(actions.ActionRefused, match="no jobs owned by a"):
        actions.transfer({}, "a", "b", "r", "carol")
    with pytest.raises(actions.ActionRefused, match="already owned"):
        actions.transfer({"j1": "a"}, "a", "a", "r", "carol")
