"""The checkpoint lifecycle (R1): one transition table and one function that applies it.

Pure: no I/O. The registry applies the result atomically; handlers publish what it returns.
Only `VALID` is ever offered for restore, and only a checkpoint that went through
`PENDING_VERIFICATION` (committed, then verified) can reach it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.core.errors import PermanentError

TRANSITIONS: Mapping[S | None, frozenset[S]] = {
    # None: the registry has no record yet. A watcher may see the commit before the folder.
    None: frozenset({S.WRITING, S.PENDING_VERIFICATION, S.WRITE_FAILED, S.FENCED}),
    # A failed attempt's partial write, reclaimed at the closure of its resume (R11): the
    # coordinator deletes its bytes and records the tombstone.
    S.WRITING: frozenset({S.PENDING_VERIFICATION, S.WRITE_FAILED, S.FENCED, S.DELETED}),
    # Fenced: committed by an attempt older than one planned for its run (`fence`). A commit
    # announced first without an identity (the watcher) and then with one (the writer) is
    # fenced from pending verification; a valid one stays valid (registered before the plan).
    S.PENDING_VERIFICATION: frozenset({S.VALID, S.CORRUPT, S.WRITE_FAILED, S.FENCED}),
    # A valid checkpoint can still fail a restore-time re-verification or a load.
    S.VALID: frozenset({S.CORRUPT, S.QUARANTINED, S.EXPIRED}),
    S.CORRUPT: frozenset({S.QUARANTINED, S.EXPIRED}),
    # Released by a human after a look: verified again, valid only if the checks pass this time.
    S.QUARANTINED: frozenset({S.PENDING_VERIFICATION, S.EXPIRED}),
    S.WRITE_FAILED: frozenset({S.QUARANTINED, S.EXPIRED, S.DELETED}),
    # Never valid, never released: retention alone ends it (expired, then deleted: a tombstone).
    S.FENCED: frozenset({S.EXPIRED}),
    S.EXPIRED: frozenset({S.DELETED}),
    S.DELETED: frozenset(),
}

EVENT_TARGETS: Mapping[str, S] = {
    "checkpoint.writing": S.WRITING,
    "checkpoint.committed": S.PENDING_VERIFICATION,
    "checkpoint.write_failed": S.WRITE_FAILED,
    "checkpoint.verified": S.VALID,
    "checkpoint.corrupt": S.CORRUPT,
    "checkpoint.quarantined": S.QUARANTINED,
    "checkpoint.released": S.PENDING_VERIFICATION,
    "checkpoint.expired": S.EXPIRED,
    "checkpoint.deleted": S.DELETED,
}
"""Events that move the lifecycle. `registered` and `conflict` report on it and move nothing."""

DECISIONS: frozenset[str] = frozenset({"checkpoint.released"})
"""Events that are a decision, not a report of an earlier stage: never read as stale (a release
targets `pending_verification`, which a late `committed` would also name)."""


STALE: Mapping[S, frozenset[S]] = {
    S.WRITING: frozenset(
        {S.PENDING_VERIFICATION, S.VALID, S.CORRUPT, S.QUARANTINED, S.WRITE_FAILED, S.FENCED}
    ),
    S.PENDING_VERIFICATION: frozenset({S.VALID, S.CORRUPT, S.QUARANTINED, S.FENCED}),
    # A fenced commit is never verified; a checker that read the record before it was fenced
    # may still report on it (or the watcher on its files): the report changes nothing.
    S.VALID: frozenset({S.FENCED}),
    S.CORRUPT: frozenset({S.QUARANTINED, S.FENCED}),
    S.QUARANTINED: frozenset({S.FENCED}),
    # The closure of a resume deletes a failed attempt's partial write, maybe while it is still
    # `writing`; the watcher then sees its folder gone and reports the write failed. Too late
    # to matter: the record stays deleted.
    S.WRITE_FAILED: frozenset({S.FENCED, S.DELETED}),
}
"""Reports of an earlier stage that arrive after the checkpoint moved on: the writer-watcher and
the writer both announce a write (so it may be verified twice), and one of them is heard late.
Ids change when a path is written again, so these are the same write, not a new one; they
change nothing. After expiry or deletion they are still illegal (nothing resurrects a deleted
checkpoint), but for a failed write's report: a no-op on a deleted record."""


AWAITS: Mapping[S, frozenset[S]] = {
    # A verdict on a commit heard before the commit.
    S.VALID: frozenset({S.WRITING}),
    S.CORRUPT: frozenset({S.WRITING}),
    # Quarantined, published right after corrupt or write_failed, heard before it.
    S.QUARANTINED: frozenset({S.WRITING, S.PENDING_VERIFICATION}),
    # Deleted, published right after expired (a retention round), heard before it. Not from
    # write_failed: a closure deletes a failed attempt's partial write without expiring it.
    S.DELETED: frozenset({S.VALID, S.CORRUPT, S.QUARANTINED, S.FENCED}),
}
"""Reports heard before the event they follow: in these states that event is still on its way
(another registrar replica holds it in its batch, or it waits for a redelivery), so the report
waits for it (`awaits_earlier`: retried) instead of being refused as illegal. Replicas of a
consumer share its deliveries, so stream order holds within one replica only."""


def awaits_earlier(current: S | None, target: S, *, report: bool = True) -> bool:
    """True when a report moving a checkpoint in ``current`` to ``target`` skips a stage whose
    event has not been applied yet (`AWAITS`); a decision never waits."""
    return report and current is not None and current in AWAITS.get(target, frozenset())


class IllegalTransition(PermanentError):
    """The event asks for a state change the lifecycle forbids (e.g. committed after deleted)."""

    code = "illegal_transition"

    def __init__(self, checkpoint_id: str, current: S | None, target: S) -> None:
        self.checkpoint_id = checkpoint_id
        self.current = current
        self.target = target
        was = current.value if current is not None else "<unknown checkpoint>"
        super().__init__(f"checkpoint {checkpoint_id}: illegal transition {was} -> {target.value}")


@dataclass(frozen=True)
class Transition:
    previous: S | None
    new: S
    changed: bool
    """False when the checkpoint is already in the target state: a repeat, so a no-op."""


def transition(
    checkpoint_id: str, current: S | None, target: S, *, report: bool = True
) -> Transition:
    """Apply one lifecycle step or raise `IllegalTransition`. Repeating a step is a no-op, and so
    is a stale report (see `STALE`); a decision (``report=False``) is never stale."""
    if current == target or (report and current in STALE.get(target, frozenset())):
        return Transition(previous=current, new=target, changed=False)
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(checkpoint_id, current, target)
    return Transition(previous=current, new=target, changed=True)


def fenced(attempt: int, planned: int | None) -> bool:
    """Fencing (R17): a commit by ``attempt`` of a run whose latest planned attempt is
    ``planned`` (None: none planned yet) comes from a stale writer. The epoch of an attempt is
    its number; ``resume.planned`` fixes the next one, so once attempt N+1 is planned every
    attempt up to N is fenced."""
    return planned is not None and attempt < planned


def restorable(state: S) -> bool:
    """Only a committed and verified checkpoint is ever offered for restore."""
    return state is S.VALID
