"""The decisions the handlers carry out: a plan or an escalation for one failed attempt
(`decide_failure`), what a load failure leads to, the verdict event, the run's end by a user."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointQuarantinedV1,
    CheckpointState,
    FailureSide,
)
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobFailedV2,
)
from ckpt_ha.contracts.resume import (
    LoadBlame,
    ResumeDivergedV1,
    ResumeEscalatedV2,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.core.locations import JobMismatch
from ckpt_ha.core.pins import Pin
from ckpt_ha.restore_coordinator.domain.compatibility import Verdict, weigh
from ckpt_ha.restore_coordinator.domain.continuity import PENDING, VERIFIED, Continuity
from ckpt_ha.restore_coordinator.domain.exclusions import Exclusions, exclusion
from ckpt_ha.restore_coordinator.domain.pins import pins_for
from ckpt_ha.restore_coordinator.domain.recompute import recompute
from ckpt_ha.restore_coordinator.domain.selection import Candidate, Selection, plan_id
from ckpt_ha.restore_coordinator.domain.stops import Escalation, Stop, stop_reason
from ckpt_ha.restore_coordinator.records import (
    History,
    PlanRecord,
    Point,
    Started,
    planned_pins,
)

NO_RESTORE_CAUSES = frozenset({FailureCause.CANCELLED})
"""Failures that end the run for automatic restores: a user cancelled the job (``scancel``, a
deleted Kubernetes Job). Restoring it would undo the user's decision; nothing is planned and
nobody is paged, as after ``job.succeeded``."""


def ends_the_run(failure: JobFailedV1) -> bool:
    """Whether this failure is the run's end rather than something to restore from."""
    return isinstance(failure, JobFailedV2) and FailureCause(failure.cause) in NO_RESTORE_CAUSES


def escalated(
    job: str, plan: str, stop: Escalation, attempt: int | None = None
) -> ResumeEscalatedV2:
    """``attempt``: the failed attempt this escalation decides (None: not a failure decision)."""
    return ResumeEscalatedV2(
        job_id=job,
        plan_id=plan,
        reason=stop.reason,
        next_step=stop.next_step,
        detail=stop.detail[:4000],
        attempt=attempt,
    )


@dataclass(frozen=True)
class Fallback:
    """The failure being decided is a load failure of a planned restore."""

    checkpoint_id: str
    """The checkpoint that failed to load (``fallback_from`` of the next plan)."""
    previous: int
    """Fallbacks already taken in this chain (the failed plan's own count)."""


@dataclass(frozen=True)
class FailureDecision:
    """What to do about one failed attempt: store `plan` and `pins`, publish `events`."""

    plan_id: str
    events: tuple[EventData, ...]
    escalation: Escalation | None = None
    plan: PlanRecord | None = None
    pins: tuple[Pin, ...] = ()
    chosen: Candidate | None = None
    verdict: Verdict | None = None
    """The compatibility verdict, when a checkpoint was weighed (None: stopped before)."""

    @property
    def outcome(self) -> tuple[str, str]:
        """(outcome, detail) as the decision metrics label it."""
        if self.escalation is not None:
            return "escalated", self.escalation.reason.value
        mode = self.verdict.mode if self.verdict is not None else None
        return "planned", mode.value if mode is not None else ""


def decide_failure(
    *,
    job: str,
    attempt: int,
    started: Started,
    history: History,
    selection: Selection,
    excluded: Iterable[str],
    last: Point | None,
    at_chosen_step: Point | None,
    failed_at: datetime,
    failed_step: int | None,
    fallback: Fallback | None = None,
    stop: Escalation | None = None,
) -> FailureDecision:
    """R9, R14, R10, R15 for one failed attempt: escalate on a stop condition, when no valid
    checkpoint is left or when the newest one cannot be restored automatically; else plan the
    newest restorable checkpoint (and pin it with the one before it).

    ``at_chosen_step``: the pre-failure progress report at the chosen checkpoint's step, if any
    (the recompute range starts there, else at the checkpoint's creation). ``stop``: a reason
    to escalate the caller already has (e.g. `cannot_load`)."""
    pid = plan_id(job, started.run_id, attempt)
    if fallback is not None:
        history = replace(history, fallbacks=fallback.previous)
    if stop is None:
        stop = stop_reason(history, started.policy, failed_at, load_failed=fallback is not None)
    if stop is not None:
        return FailureDecision(pid, (escalated(job, pid, stop, attempt),), stop)
    chosen = selection.chosen
    if chosen is None or chosen.step is None:
        detail = "no valid checkpoint left to restore"
        skipped = Exclusions.of(excluded).describe()
        if skipped:
            detail += f" (excluded after load failures: {', '.join(skipped)})"
        stop = Escalation(Stop.NO_VALID_CHECKPOINT, detail)
        return FailureDecision(pid, (escalated(job, pid, stop, attempt),), stop)
    verdict = weigh(chosen, started.target(), started)
    if verdict.mode is None:
        detail = (
            f"compatibility {verdict.compatibility.value} restoring {chosen.checkpoint_id}: "
            + "; ".join(verdict.reasons)
        )
        stop = Escalation(Stop.COMPATIBILITY_UNKNOWN, detail)
        return FailureDecision(pid, (escalated(job, pid, stop, attempt),), stop, chosen=chosen,
                               verdict=verdict)  # fmt: skip
    steps, seconds = recompute(
        checkpoint_step=chosen.step,
        checkpoint_at=at_chosen_step.at if at_chosen_step is not None else chosen.created_at,
        last_progress=last,
        failed_step=failed_step,
        failed_at=failed_at,
    )
    pins = pins_for(pid, attempt + 1, selection)
    planned = ResumePlannedV2(
        job_id=job,
        plan_id=pid,
        failed_run_id=started.run_id,
        attempt=attempt + 1,
        checkpoint_id=chosen.checkpoint_id,
        checkpoint_uri=chosen.uri,
        step=chosen.step,
        mode=verdict.mode,
        compatibility=verdict.compatibility,
        recompute_steps=steps,
        recompute_seconds=seconds,
        checkpoint_format=chosen.format,
        reasons=verdict.reasons,
        pinned=tuple(p.checkpoint_id for p in pins),
        expected_step=chosen.step,
        fallback_from=fallback.checkpoint_id if fallback is not None else None,
        failed_at=failed_at,
        fallbacks=fallback.previous + 1 if fallback is not None else 0,
        policy=started.policy,
    )
    return FailureDecision(
        pid,
        (planned,),
        plan=PlanRecord.of(planned),
        pins=tuple(planned_pins(planned)),
        chosen=chosen,
        verdict=verdict,
    )


class LoadOutcome(StrEnum):
    """What a ``resume.load_failed`` leads to (`after_load_failure`)."""

    FALLBACK = "fallback"
    """The checkpoint is bad: exclude it, quarantine it, plan the one before (R7)."""
    RETRY = "retry"
    """Storage failed the attempt: the checkpoint stays a candidate; decide again (the storage
    stop condition counts these)."""
    ESCALATE = "escalate"
    """The attempt cannot load it (format, dependency, environment): a human fixes the attempt;
    the checkpoint stays valid."""


def after_load_failure(blame: LoadBlame, side: FailureSide) -> LoadOutcome:
    if blame is LoadBlame.CHECKPOINT:
        return LoadOutcome.FALLBACK
    if side is FailureSide.INFRASTRUCTURE:
        return LoadOutcome.RETRY
    return LoadOutcome.ESCALATE


def cannot_load(job: str, plan: PlanRecord, reason: str) -> Escalation:
    return Escalation(
        Stop.CANNOT_LOAD,
        f"attempt {plan.attempt} could not load checkpoint {plan.checkpoint_id} and the failure "
        f"is the attempt's, not the checkpoint's (it stays valid): {reason}",
    )


def resumed_start(
    resumed: Started | None, failed: Started | None, plan: PlanRecord
) -> Started | None:
    """The start a load failure is decided under: the resumed attempt's own ``job.started``, else
    the failed attempt's carried over to the resumed attempt (None: neither heard yet)."""
    if resumed is not None:
        return resumed
    if failed is None:
        return None
    return failed.model_copy(update={"attempt": plan.attempt})


def foreign(
    job: str,
    checkpoint_id: str,
    what: str,
    *,
    record_job: str | None = None,
    plan_job: str | None = None,
) -> JobMismatch | None:
    """A job's event acts only on its own checkpoints and plans: one that names another job's
    checkpoint (``record_job``) or plan (``plan_job``) is refused and changes nothing (None:
    nothing against it; an unknown checkpoint or plan is not another job's)."""
    if record_job is not None and record_job != job:
        return JobMismatch(job, checkpoint_id, what, "the checkpoint belongs to another job")
    if plan_job is not None and plan_job != job:
        return JobMismatch(job, checkpoint_id, what, "the restore plan belongs to another job")
    return None


def own_plan(plan: PlanRecord | None, job: str) -> PlanRecord | None:
    """``plan`` when it is ``job``'s (a progress report naming another job's plan is read as
    naming none: it never feeds that plan's continuity verdict)."""
    return plan if plan is not None and plan.job_id == job else None


def load_failure_exclusion(checkpoint_id: str, loaded_from: str | None) -> str:
    """R7: what a load failure of ``checkpoint_id`` that blames the checkpoint rules out: the
    location its plan loaded it from (``loaded_from``: its primary or one copy; another verified
    copy of the same checkpoint is still restored before anything older), else (a plan whose
    location is not known) the whole checkpoint."""
    return exclusion(checkpoint_id, loaded_from)


def quarantine_after_load_failure(
    job: str,
    record: Candidate | None,
    reason: str,
    blame: LoadBlame = LoadBlame.CHECKPOINT,
    loaded_from: str | None = None,
) -> CheckpointQuarantinedV1 | None:
    """R7: a checkpoint whose bytes failed to load is quarantined (never offered again), unless
    the registry already moved it past valid/corrupt (quarantined, expired, deleted, unknown).
    A failure that blames the attempt (its loader, environment or storage) never does, nor one
    of a load from a copy (``loaded_from`` other than the primary): the primary's bytes were
    not read, and that copy is excluded instead (`load_failure_exclusion`)."""
    if blame is not LoadBlame.CHECKPOINT:
        return None
    if record is not None and loaded_from is not None and loaded_from != record.uri:
        return None
    if record is None or record.state not in (CheckpointState.VALID, CheckpointState.CORRUPT):
        return None
    return CheckpointQuarantinedV1(
        job_id=job,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        reason=f"load failed: {reason}"[:2000],
    )


def watches_continuity(plan: PlanRecord | None, verdict: str | None) -> bool:
    """A progress report is compared (not recorded as trajectory) while it belongs to a resumed
    attempt of a known plan that has no verdict yet."""
    return plan is not None and verdict is None


def verdict_event(plan: PlanRecord, run_id: str, result: Continuity) -> EventData | None:
    """R10: ``resume.verified`` or ``resume.diverged`` for a decided continuity (None: pending)."""
    if result.verdict == PENDING:
        return None
    common: dict[str, object] = {
        "job_id": plan.job_id,
        "plan_id": plan.plan_id,
        "run_id": run_id,
        "checkpoint_id": plan.checkpoint_id,
        "step": result.step,
        "comparisons": result.comparisons,
    }
    if result.verdict == VERIFIED:
        return ResumeVerifiedV1.model_validate(common)
    return ResumeDivergedV1.model_validate({**common, "reason": result.reason})
