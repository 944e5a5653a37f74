"""The retention-janitor's own view of resumes (R6, R15), as plain values: pure, no I/O.

What a job's restores still reference, as the janitor learned it from the events (it never reads
the restore-coordinator's state): the plans decided for it (``resume.planned``), their verdicts
(``resume.verified`` / ``resume.diverged``), which plan each resumed attempt started under
(``job.started``), and the checkpoints a plan pinned as its fallback until the resumed attempt
registers a newer valid one (``pinned``; released by ``checkpoint.registered``). Written by
`ckpt_ha.retention_janitor.projection`, stored by `ckpt_ha.retention_janitor.store`.

A plan is *in progress* while it has no verdict and less than ``keep_s`` (the coordinator's
``CKPT_HA_STATE_TTL_S``) has passed since the last event about it (its plan, its resumed
attempt's start): the coordinator keeps a plan that long without a write, and the janitor
protected what a stored plan without a verdict referenced. A pin has no such limit: like the
coordinator's, it holds until a newer valid checkpoint of the resumed attempt releases it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str
    """The event that wrote it (a replay of that event finds it there)."""


class PlanSeen(_Record):
    """A restore plan as its ``resume.planned`` stated it."""

    plan_id: str
    attempt: int
    """The resumed attempt the plan launches."""
    checkpoint_id: str
    at: AwareDatetime


class VerdictSeen(_Record):
    """The plan's continuity verdict: it references nothing any more."""

    verdict: str
    at: AwareDatetime


class StartSeen(_Record):
    """The latest start of one attempt number of the job, and the plan it named (if any)."""

    plan_id: str | None = None
    at: AwareDatetime


class PinSeen(_Record):
    """R15: a checkpoint a resumed job may still fall back to (restored from, or the one
    before it)."""

    checkpoint_id: str
    reason: str
    plan_id: str
    restored_step: int
    attempt: int
    """The resumed attempt: its own newer valid checkpoint releases the pin."""
    planned_at: AwareDatetime
    """When the plan was decided: only a checkpoint registered since releases the pin."""


class JobResumes(BaseModel):
    """Everything the janitor knows of one job's restores (empty: nothing references)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plans: Mapping[str, PlanSeen] = Field(default_factory=dict)
    """Plan id → the plan."""
    verdicts: Mapping[str, VerdictSeen] = Field(default_factory=dict)
    """Plan id → its verdict."""
    starts: Mapping[int, StartSeen] = Field(default_factory=dict)
    """Attempt → its latest start naming a plan."""
    pins: Mapping[str, PinSeen] = Field(default_factory=dict)
    """Checkpoint id → its pin."""

    def empty(self) -> bool:
        return not (self.plans or self.verdicts or self.starts or self.pins)


class PlanInProgress(BaseModel):
    """A plan without a verdict that still protects its checkpoint."""

    model_config = ConfigDict(frozen=True)

    plan: PlanSeen
    resuming: bool
    """Its resumed attempt started (the attempt's latest ``job.started`` named this plan)."""


def last_heard(view: JobResumes, plan: PlanSeen) -> datetime:
    """The time of the latest event about the plan: its decision, or its attempt's start."""
    start = view.starts.get(plan.attempt)
    if start is not None and start.plan_id == plan.plan_id:
        return max(plan.at, start.at)
    return plan.at


def in_progress(view: JobResumes, now: datetime, keep_s: float) -> list[PlanInProgress]:
    """The job's plans without a verdict, heard of within ``keep_s`` of ``now``, by plan id."""
    out = []
    for plan_id in sorted(view.plans):
        plan = view.plans[plan_id]
        if plan_id in view.verdicts or now - last_heard(view, plan) > timedelta(seconds=keep_s):
            continue
        start = view.starts.get(plan.attempt)
        out.append(
            PlanInProgress(plan=plan, resuming=start is not None and start.plan_id == plan_id)
        )
    return out


def pins(view: JobResumes) -> list[PinSeen]:
    """The job's pins, in checkpoint id order."""
    return [view.pins[c] for c in sorted(view.pins)]
