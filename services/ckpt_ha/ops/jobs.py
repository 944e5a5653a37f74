"""A job as on-call reads it (``ckpt-ha job list|show``): its attempts, failures with their
reasons, restore plans, loads, continuity verdicts, escalations, the operator's acts (hold,
unhold, chosen rollback, stop), its pins and its newest valid checkpoint, as one timeline.

Pure: it formats a job's events (where every attempt and decision is recorded) and the
registry's records of the job's checkpoints; the CLI reads both with the operator's
credentials, so it works against any deployment. The events come from the restore-coordinator's
job index (`ckpt_ha.restore_coordinator.api.JobIndexReader`: each job's events and its newest
reports, `from_index`), not from the whole stream, so a listing costs what the jobs' own
events do, whatever the number of checkpoint events. Heartbeats and progress reports are not
timeline entries (there are thousands); the last step reported is shown instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.job import (
    JobFailedV1,
    JobFailedV2,
    JobHeartbeatV1,
    JobHeldV1,
    JobProgressV1,
    JobRestoreRequestedV1,
    JobStartedV1,
    JobStopRequestedV1,
    JobSucceededV1,
    JobUnheldV1,
)
from ckpt_ha.contracts.resume import ResumeEscalatedV1
from ckpt_ha.core.pins import Pin
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.ops import restores


@dataclass(frozen=True)
class Entry:
    """One line of a job's timeline."""

    at: datetime
    kind: str
    summary: str
    details: tuple[str, ...] = ()
    attempt: int | None = None
    plan_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "kind": self.kind,
            "attempt": self.attempt,
            "plan_id": self.plan_id,
            "summary": self.summary,
            "details": list(self.details),
        }


def _act(d: JobHeldV1 | JobUnheldV1 | JobStopRequestedV1 | JobRestoreRequestedV1) -> str:
    return f"by {d.actor}" + (f": {d.reason}" if d.reason else "")


def _entry(event: Envelope[EventData]) -> Entry | None:
    d, at = event.data, event.time
    if isinstance(d, JobStartedV1):
        how = f" from {d.restored_from} (plan {d.plan_id})" if d.restored_from else ""
        return Entry(at, "started", f"attempt {d.attempt} of run {d.run_id} started{how}",
                     attempt=d.attempt, plan_id=d.plan_id)  # fmt: skip
    if isinstance(d, JobFailedV1):
        cause = d.cause.value
        bits = [f"exit code {d.exit_code}" if d.exit_code is not None else "",
                f"signal {d.signal}" if d.signal is not None else "",
                f"rank {d.rank}" if isinstance(d, JobFailedV2) and d.rank is not None else "",
                f"last step {d.last_step}" if d.last_step is not None else ""]  # fmt: skip
        extra = ", ".join(b for b in bits if b)
        summary = f"attempt {d.attempt} failed: {cause} ({d.side.value} side)"
        details = tuple(x for x in (extra, d.detail) if x)
        return Entry(at, "failed", summary, details, attempt=d.attempt, plan_id=d.plan_id)
    if isinstance(d, JobSucceededV1):
        step = f" at step {d.last_step}" if d.last_step is not None else ""
        return Entry(at, "succeeded", f"attempt {d.attempt} succeeded{step}", attempt=d.attempt)
    if isinstance(d, JobHeldV1):
        return Entry(at, "held", f"automatic restores paused {_act(d)}")
    if isinstance(d, JobUnheldV1):
        return Entry(at, "unheld", f"automatic restores resumed {_act(d)}")
    if isinstance(d, JobRestoreRequestedV1):
        return Entry(at, "restore_requested", f"rollback to {d.checkpoint_id} asked {_act(d)}")
    if isinstance(d, JobStopRequestedV1):
        return Entry(at, "stop_requested", f"stop asked {_act(d)}")
    found = restores.history([event])
    if not found:
        return None
    r = found[0]
    attempt = getattr(d, "attempt", None)
    return Entry(r.at, r.kind, r.summary, r.details, attempt=attempt, plan_id=r.plan_id)


@dataclass(frozen=True)
class Summary:
    """Where a job stands, from its events."""

    job_id: str
    run_id: str | None = None
    attempt: int | None = None
    state: str = "unknown"
    """running, failed, restoring, escalated, succeeded, cancelled or stopped."""
    held: bool = False
    last_step: int | None = None
    last_event_at: datetime | None = None
    failures: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "state": self.state,
            "held": self.held,
            "last_step": self.last_step,
            "failures": self.failures,
            "last_event_at": self.last_event_at.isoformat() if self.last_event_at else None,
        }


def _applied(s: Summary, event: Envelope[EventData]) -> Summary:
    """``s`` after one more of the job's events."""
    d = event.data
    if s.last_event_at is None or event.time > s.last_event_at:  # the newest, whatever the order
        s = replace(s, last_event_at=event.time)
    if isinstance(d, JobStartedV1):
        return replace(s, run_id=d.run_id, attempt=d.attempt, state="running")
    if isinstance(d, JobProgressV1 | JobHeartbeatV1):
        step = d.step if isinstance(d, JobProgressV1) else d.last_step
        return s if step is None else replace(s, last_step=step)
    if isinstance(d, JobFailedV1):
        return replace(
            s,
            failures=s.failures + 1,
            state="cancelled" if d.cause.value == "cancelled" else "failed",
            last_step=d.last_step if d.last_step is not None else s.last_step,
        )
    if isinstance(d, JobSucceededV1):
        return replace(s, state="succeeded")
    if isinstance(d, JobHeldV1 | JobUnheldV1):
        return replace(s, held=isinstance(d, JobHeldV1))
    if isinstance(d, JobStopRequestedV1):
        return replace(s, state="stopped")
    if d.EVENT_TYPE == "resume.planned":
        return replace(s, state="restoring")
    if isinstance(d, ResumeEscalatedV1) and s.state != "running":
        return replace(s, state="escalated")
    return s


def from_index(
    log: Sequence[Envelope[EventData]], reports: Sequence[Envelope[EventData]]
) -> list[Envelope[EventData]]:
    """A job's events as the stream reader yields the two streams: its log (stream order) and
    its newest reports merged by time, an event before a report of the same instant. Only the
    newest report, and the newest naming a step, change a summary: the others would be
    overwritten by them."""
    out: list[Envelope[EventData]] = []
    pending = sorted(reports, key=lambda e: e.time)
    i = 0
    for event in log:
        while i < len(pending) and pending[i].time < event.time:
            out.append(pending[i])
            i += 1
        out.append(event)
    return [*out, *pending[i:]]


def summaries(events: Iterable[Envelope[EventData]]) -> list[Summary]:
    """Every job seen in ``events`` (stream order), most recently active first."""
    jobs: dict[str, Summary] = {}
    for event in events:
        if event.data.EVENT_TYPE.startswith("checkpoint."):
            continue  # `ckpt-ha checkpoints list` tells those
        job = event.data.job_id
        jobs[job] = _applied(jobs.get(job) or Summary(job), event)
    found = list(jobs.values())
    return sorted(found, key=lambda s: (s.last_event_at is None, s.last_event_at), reverse=True)


@dataclass(frozen=True)
class JobView:
    summary: Summary
    timeline: list[Entry]
    newest_valid: CheckpointRecord | None
    pins: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(checkpoint id, held by, actor, reason) of every pinned checkpoint of the job."""

    def to_json(self) -> dict[str, Any]:
        nv = self.newest_valid
        return {
            **self.summary.to_json(),
            "newest_valid": None
            if nv is None
            else {"checkpoint_id": nv.checkpoint_id, "step": nv.step, "uri": nv.uri},
            "pins": [
                {"checkpoint_id": c, "by": by, "actor": actor, "reason": reason}
                for c, by, actor, reason in self.pins
            ],
            "timeline": [e.to_json() for e in self.timeline],
        }


def newest_valid(records: Sequence[CheckpointRecord]) -> CheckpointRecord | None:
    valid = [r for r in records if r.state is CheckpointState.VALID]
    return max(valid, key=lambda r: (r.step if r.step is not None else -1, r.created_at),
               default=None)  # fmt: skip


def show(
    job_id: str,
    events: Sequence[Envelope[EventData]],
    records: Sequence[CheckpointRecord],
    fallback_pins: Sequence[Pin] = (),
) -> JobView | None:
    """The job's view, None when neither the stream nor the registry knows it. Pins: the
    operator's (``ckpt-ha pin``, on the records) and the restore-coordinator's fallback pins
    (R15, held ``by`` the plan that set them)."""
    own = [e for e in events if e.data.job_id == job_id]
    if not own and not records:
        return None
    summary = Summary(job_id)
    for event in own:
        if not event.data.EVENT_TYPE.startswith("checkpoint."):  # as `summaries`: see below
            summary = _applied(summary, event)
    # The checkpoints' activity counts from their records' history (the registry), never from
    # their events: so the job index (which holds no checkpoint event) and the whole stream
    # give the same answer, whatever the times the registrar stamps on its own events.
    touched = [h.at for r in records for h in r.history]
    if touched and (summary.last_event_at is None or max(touched) > summary.last_event_at):
        summary = replace(summary, last_event_at=max(touched))
    timeline = [e for e in (_entry(ev) for ev in own) if e is not None]
    pins = [(r.checkpoint_id, p.by, p.actor, p.reason) for r in records for p in r.pins]
    pins += [(p.checkpoint_id, f"plan:{p.plan_id}", "restore-coordinator", p.reason)
             for p in fallback_pins]  # fmt: skip
    return JobView(summary, timeline, newest_valid(records), pins)
