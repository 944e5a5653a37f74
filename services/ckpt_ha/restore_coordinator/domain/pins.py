"""R15 pins a plan implies and their release, R11 leftovers of a failed attempt."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.pins import Pin
from ckpt_ha.restore_coordinator.domain.selection import Candidate, Selection
from ckpt_ha.restore_coordinator.records import Point


def pins_for(plan: str, attempt: int, selection: Selection) -> list[Pin]:
    """The restored-from checkpoint and the previous valid one stay until the resumed attempt
    registers a newer valid checkpoint."""
    if selection.chosen is None or selection.chosen.step is None:
        return []
    step = selection.chosen.step
    out = [Pin(selection.chosen.checkpoint_id, "restored from", plan, step, attempt)]
    if selection.previous is not None:
        out.append(Pin(selection.previous.checkpoint_id, "fallback", plan, step, attempt))
    return out


def to_unpin(
    pins: Iterable[Pin], *, registered_step: int, registered_attempt: int | None
) -> list[str]:
    """Pins released by a newly registered valid checkpoint of the job: newer than the restored
    step, and (when its identity says) written by the resumed attempt or a later one."""
    return sorted(
        p.checkpoint_id
        for p in pins
        if registered_step > p.restored_step
        and (registered_attempt is None or registered_attempt >= p.attempt)
    )


LEFTOVER_STATES = frozenset({CheckpointState.WRITING, CheckpointState.WRITE_FAILED})


def leftovers(
    records: Iterable[Candidate], *, run_id: str, attempt: int, failed_at: datetime
) -> list[Candidate]:
    """R11: the failed attempt's partial checkpoints (writing or write_failed, of its run, created
    no later than the failure, and of that attempt when the identity says)."""
    out = []
    for r in records:
        if r.state not in LEFTOVER_STATES:
            continue
        if r.run_id is not None and r.run_id != run_id:
            continue
        if r.identity is not None and (
            r.identity.run_id != run_id or r.identity.attempt != attempt
        ):
            continue
        if r.created_at is not None and r.created_at > failed_at:
            continue
        out.append(r)
    return out


def awaits_load_failure(plan_id: str | None, last: Point | None) -> bool:
    """A resumed attempt (it has a plan) that failed before any progress most likely failed to
    load its checkpoint: its ``resume.load_failed`` should decide, so the fallback is planned."""
    return plan_id is not None and last is None


def released_pins(
    pins: Iterable[Pin], *, state: CheckpointState, step: int, attempt: int | None
) -> list[str]:
    """R15: the pins a newly registered checkpoint of the job releases (only a valid one does)."""
    if state is not CheckpointState.VALID:
        return []
    return to_unpin(pins, registered_step=step, registered_attempt=attempt)
