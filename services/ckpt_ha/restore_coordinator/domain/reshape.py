"""R14 for the attempt that loads a plan, not the one that failed.

A plan is decided when an attempt fails, against what that attempt declared it runs on: the
attempt that will load it is not known yet. A runner relaunches on the same shape, but a run
taken over (``ckpt-ha run --resume`` with a new command, a node gone and no spare) or a
scheduler's resubmission may start on another world size, image or code. Its ``job.started``
names the plan it carries out and says what it runs on: `replan` weighs the plan's checkpoint
again against that, and the plan is re-stated for it (same plan id: a DCP checkpoint loaded at
1 rank after 2 says "reshard 2→1", not "exact"), or stopped when the loader's shape cannot load
it (the format cannot reshard its per-rank parts: unknown, with the next step).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.restore_coordinator.domain.compatibility import target_changes, weigh
from ckpt_ha.restore_coordinator.domain.decisions import escalated
from ckpt_ha.restore_coordinator.domain.selection import Candidate
from ckpt_ha.restore_coordinator.domain.shapes import world_change
from ckpt_ha.restore_coordinator.domain.stops import Escalation, Stop
from ckpt_ha.restore_coordinator.records import Started, Target


def data_position_note(
    assumed: Target, loading: Target, step: int, data_position: int | None
) -> str | None:
    """What the data position means at the loader's world size (None: the world size is the
    same): the samples seen are the checkpoint's, and the sampler's order carries over only
    when the job derives it from that global position (the same global batch); a sampler that
    splits by rank (``DistributedSampler``) orders each rank's share differently at another
    world size. The continuity check of the resumed attempt says which held."""
    change = world_change(assumed.topology, loading.topology)
    if change is None:
        return None
    old, new = change
    seen = "not recorded" if data_position is None else str(data_position)
    return (
        f"data position at world size {new}: the checkpoint's (step {step}, data position "
        f"{seen}, written at world size {old}); the sampler's order carries over only if the job "
        "derives it from that global position with the same global batch (a per-rank sampler "
        "such as DistributedSampler orders differently at another world size): the continuity "
        "check compares the resumed steps with the run before the failure"
    )


@dataclass(frozen=True)
class Replan:
    """A plan re-stated for its loader (``planned``) or stopped (``escalation``): ``events``
    are what the handler stores as the failed attempt's decision and publishes."""

    events: tuple[EventData, ...]
    planned: ResumePlannedV2 | None = None
    escalation: Escalation | None = None


def replan(
    planned: ResumePlannedV2,
    chosen: Candidate,
    assumed: Target,
    loading: Started,
    *,
    data_position: int | None = None,
) -> Replan | None:
    """The plan for the attempt that loads it (``loading``, its ``job.started``), decided
    before it started against ``assumed`` (what the failed attempt declared). None: nothing to
    change (not this plan's loader, the same target, or the same verdict at the new one; a
    plan already re-stated is not re-stated again).

    ``data_position``: the one recorded with the checkpoint's step, stated when the world size
    changes (`data_position_note`)."""
    if loading.plan_id != planned.plan_id or loading.attempt != planned.attempt:
        return None
    target = loading.target()
    changes = target_changes(assumed, target)
    if not changes:
        return None
    verdict = weigh(chosen, target, loading)
    failed = planned.attempt - 1
    note = (
        f"re-planned for attempt {planned.attempt}, the attempt that loads it, as it started: "
        + "; ".join(c.text() for c in changes)
        + f" (the plan was decided against attempt {failed}'s)"
    )
    extra = data_position_note(assumed, target, planned.step, data_position)
    reasons = (note, *verdict.reasons, *((extra,) if extra else ()))
    if verdict.mode is None:
        detail = (
            f"compatibility {verdict.compatibility.value} restoring {chosen.checkpoint_id} in "
            f"attempt {planned.attempt}: " + "; ".join(reasons)
        )
        stop = Escalation(Stop.COMPATIBILITY_UNKNOWN, detail)
        return Replan((escalated(planned.job_id, planned.plan_id, stop, failed),), escalation=stop)
    if (verdict.mode, verdict.compatibility, reasons) == (
        planned.mode,
        planned.compatibility,
        planned.reasons,
    ):
        return None
    restated = planned.model_copy(
        update={"mode": verdict.mode, "compatibility": verdict.compatibility, "reasons": reasons}
    )
    return Replan((restated,), planned=restated)
