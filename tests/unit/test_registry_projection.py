"""The registry's pure projection: fields, history and order, without Redis."""

from __future__ import annotations

import pytest

from contracts.checkpoint import CheckpointState
from services.shared.errors import DependencyNotReady
from services.shared.lifecycle import IllegalTransition
from services.shared.registry import project
from tests.support.events import committed, deleted, expired, verified


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
