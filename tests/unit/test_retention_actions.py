"""Operator actions on retention (pure): pins, unpins and tier choices, and what they refuse."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord, PinRecord, Tombstone
from ckpt_ha.core.tiers import resolve_tier
from ckpt_ha.ops import actions

AT = datetime(2026, 11, 1, tzinfo=UTC)


def record(state: CheckpointState, pins: tuple[PinRecord, ...] = ()) -> CheckpointRecord:
    tomb = None
    if state is CheckpointState.DELETED:
        tomb = Tombstone(reason="age", actor="janitor", at=AT, event_id="e")
    return CheckpointRecord(
        checkpoint_id="c1", job_id="j", uri="file:///x", state=state, created_at=AT,
        updated_at=AT, pins=pins, tombstone=tomb,
    )  # fmt: skip


def test_pin_is_refused_on_a_deleted_checkpoint_and_twice_by_one_holder() -> None:
    with pytest.raises(actions.ActionRefused, match="was deleted"):
        actions.pin(record(CheckpointState.DELETED), "eval:x", "r", "a")
    held = (PinRecord(by="eval:x", reason="r", actor="a", at=AT, event_id="e"),)
    with pytest.raises(actions.ActionRefused, match="already pinned by eval:x"):
        actions.pin(record(CheckpointState.VALID, held), "eval:x", "r", "a")
    # Another holder may pin it too; an expired one may still be saved during its grace period.
    event = actions.pin(record(CheckpointState.EXPIRED, held), "model:cand-3", "cand", "bob")
    assert (event.by, event.actor, event.reason) == ("model:cand-3", "bob", "cand")


def test_unpin_names_the_holders_when_refused() -> None:
    held = (PinRecord(by="eval:x", reason="r", actor="a", at=AT, event_id="e"),)
    with pytest.raises(actions.ActionRefused, match=r"not pinned by eval:y \(pinned by: eval:x\)"):
        actions.unpin(record(CheckpointState.VALID, held), "eval:y", "r", "a")
    assert actions.unpin(record(CheckpointState.VALID, held), "eval:x", "done", "a").by == "eval:x"


def test_choose_tier_refuses_unknown_tiers_unknown_jobs_and_repeats() -> None:
    default = resolve_tier(None, None)
    with pytest.raises(actions.ActionRefused, match="unknown tier 'gold'"):
        actions.choose_tier("j", default, "gold", "r", "a", known_job=True)
    with pytest.raises(actions.ActionRefused, match="no job 'j'"):
        actions.choose_tier("j", default, "critical", "r", "a", known_job=False)
    chosen = resolve_tier({"tier": "critical", "actor": "a", "reason": "r"}, None)
    with pytest.raises(actions.ActionRefused, match="already has tier critical"):
        actions.choose_tier("j", chosen, "critical", "r", "a", known_job=True)
    event = actions.choose_tier("j", default, "standard", "deadline", "dana", known_job=True)
    assert (event.tier, event.actor, event.reason) == ("standard", "dana", "deadline")
