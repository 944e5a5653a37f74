"""The janitor's view of resumes as a projection of the event stream: one pure function.

`apply` takes a job's view (`ckpt_ha.retention_janitor.resumes.JobResumes`) and one event and
returns the new view; the live consumers and ``ckpt-ha registry rebuild`` both call it, so the
view a rebuild replays is the one the live janitor kept.

=============================  ===============================================================
event                          changes
=============================  ===============================================================
resume.planned (v1, v2)        the plan, and its ``pinned`` checkpoints (R15)
resume.verified / .diverged    the plan's verdict: it references nothing any more
job.started                    which plan the attempt resumes (none: it resumes none)
checkpoint.registered          the pins a newer valid checkpoint of the resumed attempt (or of
                               a later one), registered after the plan, releases
=============================  ===============================================================

Idempotent: a plan already known (by its id) is not applied again, so a redelivered or
replayed ``resume.planned`` never brings back a pin a registration released; a verdict, a start
and a release set what they set. Each change also forgets what no longer counts for that job:
plans, verdicts and starts last heard of more than ``keep_s`` before the event (the
coordinator's state expiry; pins are kept until released, as the coordinator keeps them).

Order between consumers: a verdict may be applied before its plan (they come through different
durables), and the view still says the plan is decided. A registration is applied only after
every ``resume.planned`` published before it (`ckpt_ha.retention_janitor.handlers`), so the
pins it releases are there, as they were in the coordinator's state when it released them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointRegisteredV1, CheckpointState
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.contracts.resume import ResumeDivergedV1, ResumePlannedV1, ResumeVerifiedV1
from ckpt_ha.retention_janitor.resumes import (
    JobResumes,
    PinSeen,
    PlanSeen,
    StartSeen,
    VerdictSeen,
    last_heard,
)

__all__ = ["PROJECTED", "apply"]

PROJECTED: tuple[type[EventData], ...] = (
    ResumePlannedV1,
    ResumeVerifiedV1,
    ResumeDivergedV1,
    JobStartedV1,
    CheckpointRegisteredV1,
)
"""The events the view changes with (every version of each: v2 events are subclasses)."""


def apply(view: JobResumes, event: Envelope[EventData], keep_s: float) -> JobResumes:
    """The job's view after ``event`` (the same view for an event that changes nothing)."""
    data, at = event.data, event.time
    if isinstance(data, ResumePlannedV1):
        changed = _planned(view, data, event.id, at)
    elif isinstance(data, ResumeVerifiedV1 | ResumeDivergedV1):
        verdict = "verified" if isinstance(data, ResumeVerifiedV1) else "diverged"
        seen = VerdictSeen(event_id=event.id, verdict=verdict, at=at)
        changed = view.model_copy(update={"verdicts": {**view.verdicts, data.plan_id: seen}})
    elif isinstance(data, JobStartedV1):
        changed = _started(view, data, event.id, at)
    elif isinstance(data, CheckpointRegisteredV1):
        changed = _registered(view, data, at)
    else:
        return view
    return _forget_before(changed, at - timedelta(seconds=keep_s))


def _planned(view: JobResumes, data: ResumePlannedV1, event_id: str, at: datetime) -> JobResumes:
    if data.plan_id in view.plans:
        return view  # heard before: its pins may have been released since
    plan = PlanSeen(
        event_id=event_id,
        plan_id=data.plan_id,
        attempt=data.attempt,
        checkpoint_id=data.checkpoint_id,
        at=at,
    )
    pinned = {
        c: PinSeen(
            event_id=event_id,
            checkpoint_id=c,
            reason="restored from" if c == data.checkpoint_id else "fallback",
            plan_id=data.plan_id,
            restored_step=data.step,
            attempt=data.attempt,
            planned_at=at,
        )
        for c in data.pinned
    }
    return view.model_copy(
        update={"plans": {**view.plans, data.plan_id: plan}, "pins": {**view.pins, **pinned}}
    )


def _started(view: JobResumes, data: JobStartedV1, event_id: str, at: datetime) -> JobResumes:
    """The attempt's latest start: one naming a plan marks it resuming, one naming none
    (the attempt number reused by a new run) unmarks whatever plan an earlier start named."""
    starts = {k: v for k, v in view.starts.items() if k != data.attempt}
    if data.plan_id is not None:
        starts[data.attempt] = StartSeen(event_id=event_id, plan_id=data.plan_id, at=at)
    return view.model_copy(update={"starts": starts})


def _registered(view: JobResumes, data: CheckpointRegisteredV1, at: datetime) -> JobResumes:
    """R15: only a valid checkpoint past the restored step releases, only one written by the
    resumed attempt or a later one when its identity says which attempt wrote it, and only the
    pins of plans decided before it was registered (the coordinator released the pins it held
    when it heard the registration; a replay from the stream's start, as a new consumer's,
    must not let an older registration release a later plan's pins)."""
    if data.state is not CheckpointState.VALID:
        return view
    by = data.identity.attempt if data.identity is not None else None
    kept = {
        c: pin
        for c, pin in view.pins.items()
        if data.step <= pin.restored_step
        or (by is not None and by < pin.attempt)
        or at < pin.planned_at
    }
    return view if len(kept) == len(view.pins) else view.model_copy(update={"pins": kept})


def _forget_before(view: JobResumes, horizon: datetime) -> JobResumes:
    """Drop the plans (with their verdicts and starts) and the verdicts and starts last heard
    of before ``horizon``: they protect nothing any more."""
    plans = {k: p for k, p in view.plans.items() if last_heard(view, p) >= horizon}
    verdicts = {k: v for k, v in view.verdicts.items() if v.at >= horizon or k in plans}
    starts = {k: s for k, s in view.starts.items() if s.at >= horizon}
    if (len(plans), len(verdicts), len(starts)) == (
        len(view.plans),
        len(view.verdicts),
        len(view.starts),
    ):
        return view
    return view.model_copy(update={"plans": plans, "verdicts": verdicts, "starts": starts})
