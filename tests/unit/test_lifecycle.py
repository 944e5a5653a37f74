"""The whole transition matrix of the checkpoint lifecycle (R1)."""

from __future__ import annotations

import itertools

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.core.errors import PermanentError
from ckpt_ha.core.lifecycle import (
    DECISIONS,
    EVENT_TARGETS,
    STALE,
    TRANSITIONS,
    IllegalTransition,
    fenced,
    restorable,
    transition,
)

ALL: list[S | None] = [None, *S]

LEGAL = {
    (None, S.WRITING), (None, S.PENDING_VERIFICATION), (None, S.WRITE_FAILED),
    (S.WRITING, S.PENDING_VERIFICATION), (S.WRITING, S.WRITE_FAILED), (S.WRITING, S.DELETED),
    (S.PENDING_VERIFICATION, S.VALID), (S.PENDING_VERIFICATION, S.CORRUPT),
    (S.PENDING_VERIFICATION, S.WRITE_FAILED),
    (S.VALID, S.CORRUPT), (S.VALID, S.QUARANTINED), (S.VALID, S.EXPIRED),
    (S.CORRUPT, S.QUARANTINED), (S.CORRUPT, S.EXPIRED),
    (S.QUARANTINED, S.PENDING_VERIFICATION), (S.QUARANTINED, S.EXPIRED),
    (S.WRITE_FAILED, S.QUARANTINED), (S.WRITE_FAILED, S.EXPIRED), (S.WRITE_FAILED, S.DELETED),
    (S.EXPIRED, S.DELETED),
    (None, S.FENCED), (S.WRITING, S.FENCED), (S.PENDING_VERIFICATION, S.FENCED),
    (S.FENCED, S.EXPIRED),
}  # fmt: skip


@pytest.mark.parametrize(("current", "target"), list(itertools.product(ALL, list(S))))
def test_every_pair(current: S | None, target: S) -> None:
    if current == target or current in STALE.get(target, frozenset()):
        step = transition("c", current, target)
        assert not step.changed
    elif (current, target) in LEGAL:
        step = transition("c", current, target)
        assert step.changed
        assert (step.previous, step.new) == (current, target)
    else:
        with pytest.raises(IllegalTransition) as info:
            transition("c", current, target)
        assert info.value.current == current
        assert info.value.target == target
        assert "illegal transition" in str(info.value)
        assert isinstance(info.value, PermanentError)


def test_table_is_the_documented_one() -> None:
    assert {(a, b) for a, bs in TRANSITIONS.items() for b in bs} == LEGAL


def test_valid_only_after_verification() -> None:
    assert [a for a, bs in TRANSITIONS.items() if S.VALID in bs] == [S.PENDING_VERIFICATION]
    assert restorable(S.VALID)
    assert not any(restorable(s) for s in S if s is not S.VALID)


def test_stale_reports_never_resurrect() -> None:
    for target, currents in STALE.items():
        if target is S.WRITE_FAILED:
            continue
        assert not currents & {S.EXPIRED, S.DELETED}, target
    for target in (S.WRITING, S.PENDING_VERIFICATION, S.VALID):
        with pytest.raises(IllegalTransition):
            transition("c", S.DELETED, target)


def test_a_write_failing_after_its_closure_deleted_it_changes_nothing() -> None:
    """The coordinator tombstones a failed attempt's partial write while it is `writing`; the
    watcher's `write_failed` for the vanished folder comes later and is a no-op."""
    assert S.DELETED in STALE[S.WRITE_FAILED]
    step = transition("c", S.DELETED, S.WRITE_FAILED)
    assert (step.new, step.changed) == (S.WRITE_FAILED, False)


def test_deleted_is_terminal() -> None:
    assert TRANSITIONS[S.DELETED] == frozenset()


def test_every_moving_event_targets_a_state() -> None:
    # Fenced is reached by a commit the registry refuses (`core.records.fences`), not by an event
    # of its own: ``checkpoint.fenced`` reports it, as ``registered`` reports valid.
    assert set(EVENT_TARGETS.values()) == set(S) - {S.FENCED}
    assert "checkpoint.registered" not in EVENT_TARGETS
    assert "checkpoint.fenced" not in EVENT_TARGETS


@pytest.mark.parametrize(("current", "target"), list(itertools.product(ALL, list(S))))
def test_a_decision_is_never_stale(current: S | None, target: S) -> None:
    if current == target:
        assert not transition("c", current, target, report=False).changed
    elif (current, target) in LEGAL:
        assert transition("c", current, target, report=False).changed
    else:
        with pytest.raises(IllegalTransition):
            transition("c", current, target, report=False)


def test_release_is_a_decision_and_goes_back_to_verification() -> None:
    assert EVENT_TARGETS["checkpoint.released"] is S.PENDING_VERIFICATION
    assert "checkpoint.released" in DECISIONS
    # A late `committed` for a quarantined checkpoint changes nothing; a release moves it.
    assert not transition("c", S.QUARANTINED, S.PENDING_VERIFICATION).changed
    step = transition("c", S.QUARANTINED, S.PENDING_VERIFICATION, report=False)
    assert (step.previous, step.new, step.changed) == (S.QUARANTINED, S.PENDING_VERIFICATION, True)


def test_fenced_is_never_valid_nor_released() -> None:
    """A fenced commit (R17) is never verified, never released back to verification: only
    retention ends it (expired, then deleted with a tombstone)."""
    assert TRANSITIONS[S.FENCED] == frozenset({S.EXPIRED})
    assert not restorable(S.FENCED)
    for target in (S.VALID, S.CORRUPT, S.QUARANTINED, S.PENDING_VERIFICATION):
        assert not transition("c", S.FENCED, target).changed  # a late report: nothing
    with pytest.raises(IllegalTransition):
        transition("c", S.FENCED, S.PENDING_VERIFICATION, report=False)  # a release


@pytest.mark.parametrize(
    ("attempt", "planned", "expected"),
    [(1, None, False), (1, 1, False), (1, 2, True), (2, 2, False), (1, 3, True), (3, 2, False)],
)
def test_fence_of_an_attempt(attempt: int, planned: int | None, expected: bool) -> None:
    assert fenced(attempt, planned) is expected
