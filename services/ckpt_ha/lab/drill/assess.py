"""What a drill proves: the five levels of R7, each from its own evidence in the event stream.

Pure: takes the events the drill read back (in stream order) and the fault it injected, returns
the verdict. A level is never inferred from the one before: `registered` needs its own
`checkpoint.registered`, `loadable` its own `resume.loaded`, and so on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointRegisteredV1,
    CheckpointVerifiedV1,
)
from ckpt_ha.contracts.job import JobFailedV1, JobProgressV1, JobStartedV1
from ckpt_ha.contracts.resume import (
    ResumeClosedV1,
    ResumeDivergedV1,
    ResumeEscalatedV2,
    ResumeLoadedV1,
    ResumeLoadFailedV2,
    ResumePlannedV2,
    ResumeVerifiedV1,
)

LEVELS = ("generated", "verified", "registered", "loadable", "continued")
"""The five levels of evidence (R7), in the order a restore reaches them."""


@dataclass
class Level:
    passed: bool = False
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "evidence": self.evidence}


@dataclass
class Assessment:
    scenario: str
    verdict: str
    levels: dict[str, Level]
    last_valid_checkpoint: str | None
    restored_from: str | None
    continue_step: int | None
    recompute_steps: int | None
    timeline: list[dict[str, Any]]
    reasons: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    expected_levels: tuple[str, ...] = LEVELS
    """The levels the verdict requires. A scenario that passes by stopping the restore (an
    escalation) or a phase with no restore of its own expects fewer: the report shows the others
    as "not expected" rather than failed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "verdict": self.verdict,
            "levels": {name: self.levels[name].to_json() for name in LEVELS},
            "expected_levels": list(self.expected_levels),
            "last_valid_checkpoint": self.last_valid_checkpoint,
            "restored_from": self.restored_from,
            "continue_step": self.continue_step,
            "recompute_steps": self.recompute_steps,
            "timeline": self.timeline,
            "reasons": self.reasons,
            **self.extra,
        }


def _of(events: Sequence[Envelope[EventData]], kind: type[EventData]) -> list[Envelope[Any]]:
    return [e for e in events if isinstance(e.data, kind)]


def _line(event: Envelope[EventData], fault: datetime | None, what: str) -> dict[str, Any]:
    offset = (event.time - fault).total_seconds() if fault is not None else None
    return {
        "time": event.time.isoformat(),
        "t_seconds": None if offset is None else round(offset, 3),
        "event": event.type,
        "event_id": event.id,
        "what": what,
    }


def timeline(
    events: Sequence[Envelope[EventData]], job_id: str, fault: datetime | None
) -> list[dict[str, Any]]:
    """The story of the drill, from the events of its job (progress reports left out)."""
    out = []
    for e in events:
        d = e.data
        if d.job_id != job_id or isinstance(d, JobProgressV1):
            continue
        step = d.__dict__.get("step")
        cid = d.__dict__.get("checkpoint_id")
        what = d.EVENT_TYPE
        if cid:
            what += f" {cid}"
        if step is not None:
            what += f" step {step}"
        if isinstance(d, JobFailedV1):
            what += f" ({d.cause.value}, attempt {d.attempt})"
        if isinstance(d, ResumePlannedV2):
            what += f" ({d.mode.value}, {d.compatibility.value}, recompute {d.recompute_steps})"
        if isinstance(d, ResumeEscalatedV2):
            what += f": {d.reason}"
        out.append(_line(e, fault, what))
    return out


def assess_restore(
    scenario: str,
    events: Sequence[Envelope[EventData]],
    job_id: str,
    fault: datetime | None,
) -> Assessment:
    """Five levels for the checkpoint the system restored after ``fault``."""
    mine = [e for e in events if e.data.job_id == job_id]
    registered_before = [
        e for e in _of(mine, CheckpointRegisteredV1) if fault is None or e.time <= fault
    ]
    last_valid = registered_before[-1].data.checkpoint_id if registered_before else None
    plans = [e for e in _of(mine, ResumePlannedV2) if fault is None or e.time >= fault]
    plan = plans[-1] if plans else None
    restored = plan.data.checkpoint_id if plan else None
    levels = {name: Level() for name in LEVELS}
    reasons: list[str] = []

    if plan is None or restored is None:
        reasons.append("no resume.planned after the fault")
    else:
        committed = [
            e for e in _of(mine, CheckpointCommittedV1) if e.data.checkpoint_id == restored
        ]
        if committed:
            c = committed[0]
            levels["generated"] = Level(
                True,
                {"event_id": c.id, "uri": c.data.uri, "step": c.data.step,
                 "shards": c.data.shard_count, "bytes": c.data.total_bytes},
            )  # fmt: skip
        verified = [e for e in _of(mine, CheckpointVerifiedV1) if e.data.checkpoint_id == restored]
        if verified:
            v = verified[-1]
            sums = [c for c in v.data.checks if "=" in c]
            levels["verified"] = Level(
                True,
                {"event_id": v.id, "checks": [c for c in v.data.checks if "=" not in c],
                 "checksums": sums[:8], "bytes_verified": v.data.bytes_verified},
            )  # fmt: skip
        reg = [e for e in _of(mine, CheckpointRegisteredV1) if e.data.checkpoint_id == restored]
        if reg:
            r = reg[-1]
            levels["registered"] = Level(
                True, {"event_id": r.id, "step": r.data.step, "project": r.data.project}
            )
        plan_id = plan.data.plan_id
        loaded = [e for e in _of(mine, ResumeLoadedV1) if e.data.plan_id == plan_id]
        failed = [e for e in _of(mine, ResumeLoadFailedV2) if e.data.plan_id == plan_id]
        if loaded:
            ld = loaded[-1]
            levels["loadable"] = Level(
                True,
                {"event_id": ld.id, "checkpoint_id": ld.data.checkpoint_id, "step": ld.data.step,
                 "load_seconds": ld.data.load_seconds},
            )  # fmt: skip
        elif failed:
            levels["loadable"].evidence = {
                "event_id": failed[-1].id,
                "reason": failed[-1].data.reason,
            }
        ok = [e for e in _of(mine, ResumeVerifiedV1) if e.data.plan_id == plan_id]
        bad = [e for e in _of(mine, ResumeDivergedV1) if e.data.plan_id == plan_id]
        if ok:
            levels["continued"] = Level(
                True,
                {"event_id": ok[-1].id, "step": ok[-1].data.step,
                 "comparisons": [c.model_dump(mode="json") for c in ok[-1].data.comparisons]},
            )  # fmt: skip
        elif bad:
            levels["continued"].evidence = {
                "event_id": bad[-1].id,
                "reason": bad[-1].data.reason,
                "comparisons": [c.model_dump(mode="json") for c in bad[-1].data.comparisons],
            }
    progress = [
        e
        for e in _of(mine, JobProgressV1)
        if plan is not None and e.data.plan_id == plan.data.plan_id
    ]
    durations = recovery_durations(mine, fault, plan, progress)
    reasons.extend(f"level {name} not proven" for name in LEVELS if not levels[name].passed)
    return Assessment(
        scenario=scenario,
        verdict="pass" if all(level.passed for level in levels.values()) else "fail",
        levels=levels,
        last_valid_checkpoint=last_valid,
        restored_from=restored,
        continue_step=progress[0].data.step if progress else None,
        recompute_steps=plan.data.recompute_steps if plan else None,
        timeline=timeline(events, job_id, fault),
        reasons=reasons,
        extra={"durations": durations} if durations else {},
    )


def recovery_durations(
    mine: Sequence[Envelope[EventData]],
    fault: datetime | None,
    plan: Envelope[Any] | None,
    progress: Sequence[Envelope[Any]],
) -> dict[str, float]:
    """Seconds from the fault to `resume.verified`, split into what the control plane spent
    (noticing the failure, planning, relaunching, judging continuity) and what the job spent
    (loading the checkpoint, computing its first steps)."""
    if fault is None or plan is None:
        return {}
    plan_id = plan.data.plan_id
    failed = [e for e in _of(mine, JobFailedV1) if fault <= e.time <= plan.time]
    started = [e for e in _of(mine, JobStartedV1) if e.data.plan_id == plan_id]
    loaded = [e for e in _of(mine, ResumeLoadedV1) if e.data.plan_id == plan_id]
    verified = [e for e in _of(mine, ResumeVerifiedV1) if e.data.plan_id == plan_id]
    if not (failed and started and loaded and progress and verified):
        return {}
    before_verdict = [p for p in progress if p.time <= verified[0].time]
    last_progress = before_verdict[-1] if before_verdict else progress[0]
    marks = {
        "detect": (failed[0].time - fault).total_seconds(),
        "plan": (plan.time - failed[0].time).total_seconds(),
        "relaunch": (started[0].time - plan.time).total_seconds(),
        "load": (loaded[0].time - started[0].time).total_seconds(),
        "compute": (last_progress.time - loaded[0].time).total_seconds(),
        "verdict": (verified[0].time - last_progress.time).total_seconds(),
    }
    total = (verified[0].time - fault).total_seconds()
    control = marks["detect"] + marks["plan"] + marks["relaunch"] + marks["verdict"]
    return {
        **{k: round(v, 4) for k, v in marks.items()},
        "total": round(total, 4),
        "control_plane": round(control, 4),
        "control_plane_share": round(control / total, 4) if total > 0 else 0.0,
    }


def marks(
    events: Sequence[Envelope[EventData]],
    job_id: str,
    faults: Sequence[tuple[str, datetime]],
) -> dict[str, list[dict[str, Any]]]:
    """Where on the loss curve the report marks the drill: the registered checkpoints, the
    faults (at the last step reported before each) and the resumes (the step each loaded)."""
    mine = [e for e in events if e.data.job_id == job_id]
    progress = [(e.time, e.data.step) for e in _of(mine, JobProgressV1)]

    def step_at(when: datetime) -> int | None:
        before = [step for at, step in progress if at <= when]
        return max(before) if before else None

    return {
        "checkpoints": [
            {"step": e.data.step, "checkpoint_id": e.data.checkpoint_id, "event_id": e.id}
            for e in _of(mine, CheckpointRegisteredV1)
        ],
        "faults": [
            {"step": step_at(at), "time": at.isoformat(), "what": what} for what, at in faults
        ],
        "resumes": [
            {
                "step": e.data.step,
                "checkpoint_id": e.data.checkpoint_id,
                "event_id": e.id,
                "attempt": e.data.attempt,
            }
            for e in _of(mine, ResumeLoadedV1)
        ],
    }


def reclaimed(events: Sequence[Envelope[EventData]], job_id: str) -> dict[str, Any]:
    """What the restore path cleaned up after the job's verified resumes (R11), and what not."""
    closed = [
        (e.id, e.data)
        for e in events
        if e.data.job_id == job_id and isinstance(e.data, ResumeClosedV1)
    ]
    return {
        "cleaned": sorted({c for _, d in closed for c in d.cleaned}),
        "unreclaimable": sorted({c for _, d in closed for c in d.unreclaimable}),
        "event_ids": [event_id for event_id, _ in closed],
    }


MANUAL_SOURCES = ("ckpt-ha/cli",)


def manual_actions(events: Sequence[Envelope[EventData]], job_id: str) -> list[dict[str, Any]]:
    """Every action a human took on the job during the drill (a drill expects none)."""
    return [
        {
            "event": e.type,
            "event_id": e.id,
            "time": e.time.isoformat(),
            "actor": e.data.__dict__.get("actor"),
        }
        for e in events
        if e.data.job_id == job_id and e.source in MANUAL_SOURCES
    ]


RECLAIMER = "restore-coordinator"
"""Who deletes a failed attempt's partial write at the closure of its resume (R11)."""


def partial_checkpoint(
    events: Sequence[Envelope[EventData]],
    checkpoint_id: str,
    state: str | None,
    deleted_by: str | None = None,
) -> dict[str, Any]:
    """What became of a checkpoint a fault interrupted mid-write: its registry state and any
    ``committed`` / ``registered`` event for it (there must be none: R1). ``ended_failed``: it
    is ``write_failed``, or ``deleted`` by the closure that reclaimed the failed attempt's
    partial writes (``deleted_by``: its tombstone's actor)."""
    kinds = (".checkpoint.committed.v", ".checkpoint.registered.v")
    faked = [e.id for e in events if e.data.__dict__.get("checkpoint_id") == checkpoint_id
             and any(kind in e.type for kind in kinds)]  # fmt: skip
    ended_failed = state == "write_failed" or (state == "deleted" and deleted_by == RECLAIMER)
    return {
        "checkpoint_id": checkpoint_id,
        "state": state,
        "deleted_by": deleted_by,
        "ended_failed": ended_failed,
        "committed_or_registered": faked,
    }


def judged(result: dict[str, Any], checks: dict[str, bool], *, phases: bool) -> dict[str, Any]:
    """A drill's ``result`` (its assessment's JSON and evidence) with its own ``checks``: each
    one not met is a reason, and the drill passes when its assessed phases passed (``phases``)
    and every check is met."""
    result["checks"] = checks
    result["reasons"] += [f"not met: {what}" for what, ok in checks.items() if not ok]
    result["verdict"] = "pass" if phases and all(checks.values()) else "fail"
    return result
