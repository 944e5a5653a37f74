"""Restore decisions, pure: no I/O, no clock, no Redis. Each handler fetches, calls one of the
``decide_*`` functions here (or `continuity`, `to_unpin`, `leftovers`), persists, publishes.

* `compatibility` (R14): the checkpoint's identity against the restore target (what the failed
  attempt's ``job.started`` said it runs on), under the job's declared rules.
* `select` picks the checkpoint to restore and the fallback to keep pinned (R15).
* `recompute` states what a resume from an older checkpoint costs (R10).
* `stop_reason` (R9): restart loops, the same failure repeating, fallbacks exhausted, storage
  faults growing → escalate with the runbook's next step.
* `continuity` (R10): the resumed attempt's progress against the pre-failure trajectory.
* `leftovers` (R11) and `to_unpin` (R15).
* `ends_the_run`: a failure no restore follows (a user cancelled the job).
* `decide_failure` (a plan or an escalation for one failed attempt), `verdict_event`,
  `quarantine_after_load_failure`, `resumed_start` and `closure`: what the handlers publish.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointDeletedV1,
    CheckpointIdentity,
    CheckpointQuarantinedV1,
    CheckpointState,
    FailureSide,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    CompatibilityRule,
    FailureCause,
    JobFailedV1,
    JobFailedV2,
    JobPolicy,
    Tolerance,
)
from ckpt_ha.contracts.resume import (
    Comparison,
    Compatibility,
    LoadBlame,
    ResumeClosedV1,
    ResumeDivergedV1,
    ResumeEscalatedV2,
    ResumeMode,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.core.locations import JobMismatch
from ckpt_ha.core.pins import Pin
from ckpt_ha.restore_coordinator.records import (
    Failure,
    History,
    PlanRecord,
    Point,
    Started,
    Target,
    planned_pins,
)

__all__ = [
    "Candidate",
    "Failure",
    "History",
    "Pin",
    "PlanRecord",
    "Point",
    "Selection",
    "Started",
    "Stop",
    "Target",
]

PLAN_NAMESPACE = uuid.UUID("3a4f7c52-2f3e-4b8e-9d61-0c6a7b1e5d24")

MISSING = "<none>"
"""How a field neither side recorded, or only one side recorded, is shown in reasons."""


NO_RESTORE_CAUSES = frozenset({FailureCause.CANCELLED})
"""Failures that end the run for automatic restores: a user cancelled the job (``scancel``, a
deleted Kubernetes Job). Restoring it would undo the user's decision; nothing is planned and
nobody is paged, as after ``job.succeeded``."""


def ends_the_run(failure: JobFailedV1) -> bool:
    """Whether this failure is the run's end rather than something to restore from."""
    return isinstance(failure, JobFailedV2) and failure.cause in NO_RESTORE_CAUSES


# --- R14 compatibility ---------------------------------------------------------------------


def topology_text(topology: Topology | None) -> str | None:
    """``world_size/tp/pp`` as rules name it (None: not recorded)."""
    if topology is None:
        return None
    return f"{topology.world_size}/{topology.tensor_parallel}/{topology.pipeline_parallel}"


def _fields(
    environment: RuntimeEnvironment | None, topology: Topology | None, code_version: str | None
) -> dict[str, str | None]:
    env = environment or RuntimeEnvironment()
    out: dict[str, str | None] = {
        "framework": env.framework,
        "framework_version": env.framework_version,
        "python_version": env.python_version,
        "image": env.image,
        "code_version": code_version,
        "topology": topology_text(topology),
    }
    for name, version in env.libraries.items():
        out[f"libraries.{name}"] = version
    return out


@dataclass(frozen=True)
class Difference:
    field: str
    written: str | None
    target: str | None

    def text(self) -> str:
        return f"{self.field}: {self.written or MISSING} -> {self.target or MISSING}"


def differences(identity: CheckpointIdentity | None, target: Target) -> list[Difference]:
    """Every compared field that differs. A field missing on both sides is equal; missing on one
    side is a difference (nobody can say the two match)."""
    written = (
        _fields(identity.environment, identity.topology, identity.code_version)
        if identity is not None
        else _fields(None, None, None)
    )
    wanted = _fields(target.environment, target.topology, target.code_version)
    names = sorted(set(written) | set(wanted))
    return [
        Difference(n, written.get(n), wanted.get(n))
        for n in names
        if written.get(n) != wanted.get(n)
    ]


def _matches(pattern: str, value: str | None) -> bool:
    return pattern == "*" or (value is not None and pattern == value)


def rule_for(diff: Difference, rules: Iterable[CompatibilityRule]) -> CompatibilityRule | None:
    """The first declared rule allowing this difference (``*`` matches any value, also none)."""
    for rule in rules:
        if (
            rule.field == diff.field
            and _matches(rule.written, diff.written)
            and _matches(rule.target, diff.target)
        ):
            return rule
    return None


@dataclass(frozen=True)
class Verdict:
    compatibility: Compatibility
    mode: ResumeMode | None
    """None: no automatic restore (escalate)."""
    reasons: tuple[str, ...]


def compatibility(
    identity: CheckpointIdentity | None,
    target: Target,
    policy: JobPolicy,
    *,
    training_state: bool = True,
) -> Verdict:
    """R14: identical → exact resume; every difference declared → compatible resume; anything
    else is `unknown`: never resumed, at most a labelled weights-only initialisation when the
    policy allows it. A checkpoint without optimizer state (``training_state=False``) can only
    initialise weights, whatever its compatibility."""
    diffs = differences(identity, target)
    reasons: list[str] = []
    undeclared: list[Difference] = []
    for diff in diffs:
        rule = rule_for(diff, policy.compatible)
        if rule is None:
            undeclared.append(diff)
            reasons.append(f"{diff.text()} (no declared rule)")
        else:
            reasons.append(
                f"{diff.text()} (declared: {rule.field} {rule.written} -> {rule.target})"
            )
    if undeclared:
        verdict = Compatibility.UNKNOWN
        mode: ResumeMode | None = ResumeMode.WEIGHTS_ONLY if policy.allow_weights_only else None
    elif diffs:
        verdict, mode = Compatibility.DECLARED_COMPATIBLE, ResumeMode.COMPATIBLE
    else:
        verdict, mode = Compatibility.IDENTICAL, ResumeMode.EXACT
    if not training_state and mode is not None and mode is not ResumeMode.WEIGHTS_ONLY:
        reasons.append("checkpoint holds weights only (no optimizer/scheduler state)")
        mode = ResumeMode.WEIGHTS_ONLY if policy.allow_weights_only else None
    if mode is ResumeMode.WEIGHTS_ONLY:
        reasons.append("weights-only initialisation allowed by policy: NOT a job resume")
    return Verdict(verdict, mode, tuple(reasons))


# --- plan selection (R7, R15) --------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """What the coordinator needs of a registry record."""

    checkpoint_id: str
    step: int | None
    uri: str
    state: CheckpointState
    identity: CheckpointIdentity | None = None
    created_at: datetime | None = None
    exact_resume: bool | None = None
    format: str | None = None
    run_id: str | None = None
    traceparent: str | None = None
    """The checkpoint's trace context (from the registry): a restore continues its trace."""
    tracestate: str | None = None
    inherited_from: int | None = None
    """The attempt whose ``job.started`` filled in identity the checkpoint does not carry
    (`with_inherited_identity`), if any."""


INHERITED = ("environment", "topology", "code_version")
"""What a checkpoint without its own identity takes from the attempt that was running when it
appeared: what that attempt declared it runs on at ``job.started``."""


def lacks_identity(candidate: Candidate) -> bool:
    """The checkpoint records no identity, or not all of what a restore is checked against."""
    identity = candidate.identity
    return identity is None or any(getattr(identity, f) is None for f in INHERITED)


def writer_attempt(candidate: Candidate, starts: Sequence[Started]) -> Started | None:
    """The attempt that wrote ``candidate``: the one its identity names (same run and attempt),
    else, for a checkpoint with no identity, the newest attempt started before it appeared."""
    identity = candidate.identity
    if identity is not None:
        return next(
            (s for s in starts if (s.run_id, s.attempt) == (identity.run_id, identity.attempt)),
            None,
        )
    if candidate.created_at is None:
        return None
    before = [s for s in starts if s.at <= candidate.created_at]
    return max(before, key=lambda s: (s.at, s.attempt), default=None)


def with_inherited_identity(candidate: Candidate, job: str, starts: Sequence[Started]) -> Candidate:
    """R14 for checkpoints written by plain ``dcp.save`` or a Trainer without ckpt-ha's callback:
    what they do not record (environment, topology, code version) is what the attempt that
    wrote them declared at ``job.started``, bound by job, run, attempt and time. Fields the
    checkpoint records itself are never overridden; nothing known → unchanged."""
    if not lacks_identity(candidate):
        return candidate
    identity = candidate.identity
    writer = writer_attempt(candidate, starts)
    if writer is None:
        return candidate
    base = identity or CheckpointIdentity(
        job_id=job, run_id=writer.run_id, attempt=writer.attempt, created_at=candidate.created_at
    )
    filled = base.model_copy(
        update={
            "environment": base.environment or writer.environment,
            "topology": base.topology or writer.topology,
            "code_version": base.code_version or writer.code_version,
        }
    )
    return replace(candidate, identity=filled, inherited_from=writer.attempt)


@dataclass(frozen=True)
class Selection:
    chosen: Candidate | None
    previous: Candidate | None
    """The next older valid checkpoint: kept pinned as fallback (R15)."""
    verifying: Candidate | None = None
    """The newest checkpoint newer than ``chosen`` still pending verification, if any: committed
    with its evidence, not yet checked (`verification_to_await`)."""


def select(newest_first: Iterable[Candidate], excluded: Iterable[str] = ()) -> Selection:
    """The newest valid checkpoint not excluded (failed to load before), the one after it, and
    the newest one still being verified above them."""
    skip = set(excluded)
    picked: list[Candidate] = []
    verifying: Candidate | None = None
    for c in newest_first:
        if c.checkpoint_id in skip or c.step is None:
            continue
        if c.state is CheckpointState.PENDING_VERIFICATION and not picked and verifying is None:
            verifying = c
        if c.state is CheckpointState.VALID:
            picked.append(c)
            if len(picked) == 2:
                break
    return Selection(
        picked[0] if picked else None, picked[1] if len(picked) > 1 else None, verifying
    )


def verification_to_await(
    selection: Selection, failed_at: datetime, now: datetime, grace_s: float
) -> Candidate | None:
    """The checkpoint a fresh failure should wait for before it is decided, if any.

    A job that crashes right after a save leaves its newest checkpoints committed but not yet
    verified: deciding at once restores an older one (more to recompute) or, when none is valid
    yet, escalates `no_valid_checkpoint` although a good checkpoint is seconds from valid. Until
    ``grace_s`` after the failure, the newest one pending verification (newer than the chosen
    one) is waited for; after it, the failure is decided with what is valid then."""
    if selection.verifying is None or not within_grace(failed_at, now, grace_s):
        return None
    return selection.verifying


def within_grace(failed_at: datetime, now: datetime, grace_s: float) -> bool:
    """Whether a fresh failure may still wait for a checkpoint on its way (`verification_to_
    await`, `awaits_commit`): until ``grace_s`` after it; then it is decided with what is
    valid."""
    return (now - failed_at).total_seconds() < grace_s


def awaits_commit(committed_at: datetime, failed_at: datetime) -> bool:
    """Whether a fresh failure, `within_grace`, waits for the registry to record the job's
    newest commit (made at ``committed_at``), if it has not yet.

    A job that crashes a moment after a save can be heard failing before the registrar has
    handled that save's commit: deciding then restores an older checkpoint, and the commit,
    handled after the plan, is fenced as a stale writer's (R17) although it was written before
    the failure. So a commit made before the failure is waited for (once registered, the wait
    for its verification, `verification_to_await`, takes over). One made at or after the
    failure is a stale writer's: never waited for."""
    return committed_at < failed_at


def fenced(plan: PlanRecord | None, sent_at: datetime) -> bool:
    """Whether a report of the attempt ``plan`` resumes from (R17) is a stale writer's: sent
    at or after that attempt's failure. One sent before it is the attempt's own progress, read
    late (a coordinator catching up), and counts: the answer depends on the report and the plan,
    never on the order they are read in."""
    return plan is not None and sent_at >= plan.failed_at


@functools.lru_cache(maxsize=16_384)
def plan_id(job_id: str, run_id: str, failed_attempt: int) -> str:
    """One plan per failure: the same failure, heard twice or by two replicas, names one plan.
    (Cached: every progress report asks for the plan that would fence it, and a running
    attempt asks again with each report.)"""
    return str(uuid.uuid5(PLAN_NAMESPACE, f"{job_id}|{run_id}|{failed_attempt}"))


# --- recompute range (R10) -----------------------------------------------------------------


def recompute(
    *,
    checkpoint_step: int,
    checkpoint_at: datetime | None,
    last_progress: Point | None,
    failed_step: int | None,
    failed_at: datetime,
) -> tuple[int, float]:
    """(steps, seconds) lost: from the checkpoint (its step's progress report, else its
    creation time) to the failed attempt's last progress (else the failure itself)."""
    last_step = max(
        [s for s in (failed_step, last_progress.step if last_progress else None) if s is not None],
        default=checkpoint_step,
    )
    steps = max(0, last_step - checkpoint_step)
    end = last_progress.at if last_progress is not None else failed_at
    seconds = max(0.0, (end - checkpoint_at).total_seconds()) if checkpoint_at else 0.0
    return steps, seconds


# --- R9 stop conditions --------------------------------------------------------------------

RUNBOOK = "docs/RUNBOOK.md"
"""Where escalations point: each next step is an anchor of this file's step sections."""


class Stop(StrEnum):
    """Escalation reasons, each with the runbook step a human takes next."""

    RESTART_LOOP = "restart_loop"
    SAME_FAILURE = "same_failure_repeating"
    FALLBACKS_EXHAUSTED = "fallbacks_exhausted"
    STORAGE_ERRORS = "storage_errors_growing"
    COMPATIBILITY_UNKNOWN = "compatibility_unknown"
    NO_VALID_CHECKPOINT = "no_valid_checkpoint"
    UNRECLAIMABLE = "unreclaimable_leftovers"
    CANNOT_LOAD = "attempt_cannot_load"
    """A resumed attempt could not load a valid checkpoint for a reason that blames the attempt
    (unsupported format, missing dependency, environment): the checkpoint stays valid."""


NEXT_STEPS: Mapping[Stop, str] = {
    Stop.RESTART_LOOP: f"{RUNBOOK}#stop-runaway-retries: stop runaway retries",
    Stop.SAME_FAILURE: f"{RUNBOOK}#stop-runaway-retries: stop runaway retries",
    Stop.FALLBACKS_EXHAUSTED: f"{RUNBOOK}#choose-rollback-version: choose a rollback version",
    Stop.STORAGE_ERRORS: f"{RUNBOOK}#check-storage: check storage before any restore",
    Stop.COMPATIBILITY_UNKNOWN: f"{RUNBOOK}#prepare-environment: prepare the restore environment",
    Stop.NO_VALID_CHECKPOINT: f"{RUNBOOK}#choose-rollback-version: choose a rollback version",
    Stop.UNRECLAIMABLE: f"{RUNBOOK}#reclaim-leftovers: reclaim leftovers by hand",
    Stop.CANNOT_LOAD: f"{RUNBOOK}#prepare-environment: prepare the restore environment",
}


@dataclass(frozen=True)
class Escalation:
    reason: Stop
    detail: str

    @property
    def next_step(self) -> str:
        return NEXT_STEPS[self.reason]


def stop_reason(
    history: History, policy: JobPolicy, now: datetime, *, load_failed: bool = False
) -> Escalation | None:
    """R9: None to go on restoring, else why to stop. Checked before every plan."""
    since = now.timestamp() - policy.restart_window_s
    recent = [t for t in history.restarts if t.timestamp() >= since]
    if len(recent) >= policy.max_restarts:
        return Escalation(
            Stop.RESTART_LOOP,
            f"{len(recent)} automatic restores within {policy.restart_window_s:g}s "
            f"(max_restarts {policy.max_restarts})",
        )
    same = 0
    last = history.failures[-1].signature if history.failures else None
    if last is not None:
        for f in reversed(history.failures):
            if f.signature != last:
                break
            same += 1
    if same >= policy.max_same_failure:
        return Escalation(
            Stop.SAME_FAILURE,
            f"failure {last} repeated {same} times in a row (max_same_failure "
            f"{policy.max_same_failure})",
        )
    storage = [t for t in history.storage_errors if t.timestamp() >= since]
    if len(storage) >= policy.max_storage_errors:
        return Escalation(
            Stop.STORAGE_ERRORS,
            f"{len(storage)} storage-side failures within {policy.restart_window_s:g}s "
            f"(max_storage_errors {policy.max_storage_errors})",
        )
    if load_failed and history.fallbacks >= policy.max_fallbacks:
        return Escalation(
            Stop.FALLBACKS_EXHAUSTED,
            f"{history.fallbacks + 1} checkpoints failed to load (max_fallbacks "
            f"{policy.max_fallbacks})",
        )
    return None


# --- R10 continuity ------------------------------------------------------------------------


def within(tolerance: Tolerance, expected: float, observed: float) -> tuple[bool, float]:
    """``|observed - expected| <= abs + rel * |expected|``; also returns the allowed distance."""
    allowed = tolerance.abs + tolerance.rel * abs(expected)
    return abs(observed - expected) <= allowed, allowed


def compare_point(expected: Point, observed: Point, policy: JobPolicy) -> list[Comparison]:
    """Data position and RNG fingerprint exactly (when the trajectory has them), declared
    metrics within their tolerance (when the trajectory has them)."""
    at = f"step {observed.step}"
    out: list[Comparison] = []
    if expected.data_position is not None:
        out.append(
            Comparison(
                name=f"{at}: data_position",
                expected=float(expected.data_position),
                observed=None if observed.data_position is None else float(observed.data_position),
                ok=observed.data_position == expected.data_position,
            )
        )
    if expected.rng_fingerprint is not None:
        out.append(
            Comparison(
                name=f"{at}: rng_fingerprint",
                expected=expected.rng_fingerprint,
                observed=observed.rng_fingerprint,
                ok=observed.rng_fingerprint == expected.rng_fingerprint,
            )
        )
    for tol in policy.tolerances:
        want = expected.metrics.get(tol.metric)
        if want is None:
            continue
        got = observed.metrics.get(tol.metric)
        ok, allowed = within(tol, want, got) if got is not None else (False, 0.0)
        if got is None:
            allowed = tol.abs + tol.rel * abs(want)
        out.append(
            Comparison(
                name=f"{at}: {tol.metric}",
                expected=want,
                observed=got,
                tolerance=allowed,
                ok=ok,
            )
        )
    return out


@dataclass(frozen=True)
class Continuity:
    verdict: str
    """``pending`` (need more reports), ``verified`` or ``diverged``."""
    comparisons: tuple[Comparison, ...] = ()
    reason: str = ""
    step: int = 0


PENDING, VERIFIED, DIVERGED = "pending", "verified", "diverged"


def continuity(
    *,
    restored_step: int,
    trajectory: Mapping[int, Point],
    observed: Sequence[Point],
    policy: JobPolicy,
) -> Continuity:
    """R10 over the resumed attempt's first reports (in arrival order): the first must be at the
    restored step or the one after; each later one at a step the pre-failure trajectory knows is
    compared. The verdict comes after ``continuity_steps`` compared reports, or as soon as a
    comparison fails, or when the run passes the end of the old trajectory."""
    if not observed:
        return Continuity(PENDING)
    first = observed[0]
    start = Comparison(
        name="first step",
        expected=float(restored_step + 1),
        observed=float(first.step),
        ok=first.step in (restored_step, restored_step + 1),
    )
    if not start.ok:
        return Continuity(
            DIVERGED,
            (start,),
            f"first progress at step {first.step}, expected {restored_step} or {restored_step + 1}",
            first.step,
        )
    comparisons: list[Comparison] = [start]
    compared = 0
    last_known = max(trajectory, default=-1)
    for point in observed:
        expected = trajectory.get(point.step)
        if expected is None:
            if point.step > last_known:
                reason = "" if compared else "no pre-failure progress at the resumed steps"
                return Continuity(VERIFIED, tuple(comparisons), reason, point.step)
            continue
        found = compare_point(expected, point, policy)
        comparisons.extend(found)
        compared += 1
        bad = [c for c in found if not c.ok]
        if bad:
            return Continuity(
                DIVERGED,
                tuple(comparisons),
                "; ".join(f"{c.name} {c.observed} vs {c.expected}" for c in bad),
                point.step,
            )
        if compared >= policy.continuity_steps:
            return Continuity(VERIFIED, tuple(comparisons), "", point.step)
    return Continuity(PENDING, tuple(comparisons), "", observed[-1].step)


# --- R15 pins and R11 leftovers ------------------------------------------------------------


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


# --- decisions the handlers carry out ------------------------------------------------------


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
        skipped = sorted(set(excluded))
        if skipped:
            detail += f" (excluded after load failures: {', '.join(skipped)})"
        stop = Escalation(Stop.NO_VALID_CHECKPOINT, detail)
        return FailureDecision(pid, (escalated(job, pid, stop, attempt),), stop)
    verdict = compatibility(
        chosen.identity,
        started.target(),
        started.policy,
        training_state=chosen.exact_resume is not False,
    )
    if chosen.inherited_from is not None:
        note = (
            f"identity the checkpoint does not record taken from attempt {chosen.inherited_from}'s "
            "job.started (the attempt that wrote it)"
        )
        verdict = replace(verdict, reasons=(note, *verdict.reasons))
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


def quarantine_after_load_failure(
    job: str, record: Candidate | None, reason: str, blame: LoadBlame = LoadBlame.CHECKPOINT
) -> CheckpointQuarantinedV1 | None:
    """R7: a checkpoint whose bytes failed to load is quarantined (never offered again), unless
    the registry already moved it past valid/corrupt (quarantined, expired, deleted, unknown).
    A failure that blames the attempt (its loader, environment or storage) never does."""
    if blame is not LoadBlame.CHECKPOINT:
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


ACTOR = "restore-coordinator"
"""Who the closure's tombstones name as the deleter (R6)."""


@dataclass(frozen=True)
class Reclaimed:
    """One leftover whose bytes the closure deleted."""

    checkpoint_id: str
    uri: str
    objects_deleted: int
    """Storage objects removed (0: they were already gone)."""
    kept: str = ""
    """What under its location was kept, and why (other live checkpoints' folders)."""

    def cleaned(self) -> str:
        """Its entry in ``resume.closed.cleaned``."""
        return f"{self.uri} ({self.kept})" if self.kept else self.uri


@dataclass(frozen=True)
class Closure:
    events: tuple[EventData, ...]
    escalation: Escalation | None = None


def closure(
    job: str, plan: str, reclaimed: Sequence[Reclaimed], unreclaimable: Sequence[str]
) -> Closure:
    """R11: a tombstone for each leftover whose bytes were deleted (R6: the record ends
    ``deleted``, never listed as ``writing`` with its bytes gone), then ``resume.closed`` with
    what was cleaned; what could not be escalates (a human reclaims it, and its record stays)."""
    reason = f"partial write of the failed attempt, reclaimed when resume plan {plan} closed"
    tombstones = tuple(
        CheckpointDeletedV1(
            job_id=job,
            checkpoint_id=r.checkpoint_id,
            uri=r.uri,
            reason="; ".join(part for part in (reason, r.kept) if part),
            actor=ACTOR,
            objects_deleted=r.objects_deleted,
        )
        for r in reclaimed
    )
    closed = ResumeClosedV1(
        job_id=job,
        plan_id=plan,
        cleaned=tuple(r.cleaned() for r in reclaimed),
        unreclaimable=tuple(unreclaimable),
    )
    if not unreclaimable:
        return Closure((*tombstones, closed))
    stop = Escalation(Stop.UNRECLAIMABLE, "; ".join(unreclaimable))
    return Closure((*tombstones, closed, escalated(job, plan, stop)), stop)


def refuse_rollback(
    job: str, checkpoint_id: str, owner: str | None, state: CheckpointState | None
) -> str | None:
    """Why a rollback of ``job`` to ``checkpoint_id`` (registered for job ``owner`` in
    ``state``; None: not registered) is refused, or None: only a valid checkpoint of the job's
    own is restored."""
    if owner is None or state is None:
        return f"no checkpoint {checkpoint_id} in the registry"
    if owner != job:
        return f"checkpoint {checkpoint_id} belongs to job {owner}, not {job}"
    if state is not CheckpointState.VALID:
        return f"checkpoint {checkpoint_id} is {state.value}, not valid"
    return None
