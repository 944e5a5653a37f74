"""Whether a checkpoint folder gone as a whole is its writer's rotation or a loss. Pure.

A framework's rotation (the Trainer's ``save_total_limit``, Lightning's ``save_top_k``, Orbax's
``max_to_keep``) removes a job's older checkpoints once a newer one is written: it never
removes the job's newest, and writes the newer one before removing the older. So a committed
folder that vanished as a whole is its writer's deletion only while a NEWER checkpoint of the
same job (a later step; the same or no step: a later first write), there before it went, is
still on storage, committed (`Removal.ROTATION`). When the newest is gone
too (a wiped disk, a deleted prefix, a lost bucket) it is a loss (`Removal.LOSS`): never
recorded as a deletion, condemned by the integrity-checker's scrub, which names a copy when
there is one. A newer folder still being written leaves it undecided (`Removal.UNDECIDED`):
the Trainer removes the old folder inside its save, before the new one is committed.

The limit: a job that deletes its own newest checkpoint is treated as a loss (condemned, and
paged for when it was the job's only one).

One rule for both sides: the writer-watcher (``writer_watcher.removals``, from the folders it
tracks) and the scrub's skip (``integrity_checker.scrub``, from the registry's records).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum

Order = tuple[int | None, datetime]
"""Where a checkpoint lies in its job's sequence: its step (None: unknown) and when it was
first written or seen."""


class Removal(StrEnum):
    ROTATION = "rotation"
    """A newer checkpoint of the job is committed and present: its writer's deletion."""
    UNDECIDED = "undecided"
    """No newer one committed yet, but a newer one is being written: decide later."""
    LOSS = "loss"
    """The job's newest is gone too: lost, never a deletion."""


def newer(other: Order, than: Order) -> bool:
    """``other`` comes after ``than`` in their job: a later step when both are known and
    differ, else a later first write."""
    (step, at), (than_step, than_at) = other, than
    if step is not None and than_step is not None and step != than_step:
        return step > than_step
    return at > than_at


def removal_of(gone: Order, committed: Iterable[Order], writing: Iterable[Order] = ()) -> Removal:
    """What a folder gone as a whole (``gone``) is, given the job's other checkpoints still on
    storage: ``committed`` (complete, committed or valid) and ``writing`` (not yet committed)."""
    if any(newer(other, gone) for other in committed):
        return Removal.ROTATION
    if any(newer(other, gone) for other in writing):
        return Removal.UNDECIDED
    return Removal.LOSS
