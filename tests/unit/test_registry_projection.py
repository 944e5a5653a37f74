"""The registry's pure projection: fields, history and order, without Redis."""

from __future__ import annotations

import pytest

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState, CheckpointVerifiedV1
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.core.records import project
from tests.support.events import T0, committed, deleted, expired, verified


def test_committed_creates_a_pending_record() -> None:
    event = committed("c1", step=42)
    record, step = project(None, event)
    assert record is not None
    assert step is not None
    assert step.changed
    assert record.state is CheckpointState.PENDING_VERIFICATION
    assert record.step == 42
    assert record.created_at == event.time
    assert [h.event_id for h in record.history] == [event.id]


def test_verified_before_committed_waits() -> None:
    with pytest.raises(DependencyNotReady):
        project(None, verified("c1"))


def test_repeat_transition_changes_nothing() -> None:
    record, _ = project(None, committed("c1"))
    again, step = project(record, committed("c1", key="other"))
    assert again == record
    assert step is not None
    assert not step.changed


def test_full_life_and_illegal_resurrection() -> None:
    record = None
    for event in (committed("c1"), verified("c1"), expired("c1"), deleted("c1")):
        record, _ = project(record, event)
    assert record is not None
    assert record.state is CheckpointState.DELETED
    assert record.exact_resume is True
    assert [h.state for h in record.history] == [
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.VALID,
        CheckpointState.EXPIRED,
        CheckpointState.DELETED,
    ]
    with pytest.raises(IllegalTransition):
        project(record, committed("c1", key="resubmitted"))


def test_verified_records_the_checksums_a_scrub_compares_against() -> None:
    record, _ = project(None, committed("c1"))
    event = build(
        CheckpointVerifiedV1(
            job_id="job-1", checkpoint_id="c1", uri="file:///data/job-1/step-100",
            checks=("sizes", "checksums:xxh3_64", "a.bin=xxh3_64:00ff", "b/c.bin=sha256:abcd"),
        ),
        source="test/checker", time=T0, key="k",
    )  # fmt: skip
    record, _ = project(record, event)
    assert record is not None
    assert record.checksums == {"a.bin": "xxh3_64:00ff", "b/c.bin": "sha256:abcd"}
    assert project(None, committed("c2"))[0].checksums == {}  # type: ignore[union-attr]
