"""Restore decisions, pure: no I/O, no clock, no Redis.

* `compatibility` (R14): the checkpoint's identity against the restore target (what the failed
  attempt's ``job.started`` said it runs on), under the job's declared rules.
* `select` picks the checkpoint to restore and the fallback to keep pinned (R15).
* `recompute` states what a resume from an older checkpoint costs (R10).
* `stop_reason` (R9): restart loops, the same failure repeating, fallbacks exhausted, storage
  faults growing → escalate with the runbook's next step.
* `continuity` (R10): the resumed attempt's progress against the pre-failure trajectory.
* `leftovers` (R11) and `to_unpin` (R15).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from ckpt_ha.contracts.checkpoint import (
    CheckpointIdentity,
    CheckpointState,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import CompatibilityRule, JobPolicy, Tolerance
from ckpt_ha.contracts.resume import Comparison, Compatibility, ResumeMode

PLAN_NAMESPACE = uuid.UUID("3a4f7c52-2f3e-4b8e-9d61-0c6a7b1e5d24")

MISSING = "<none>"
"""How a field neither side recorded, or only one side recorded, is shown in reasons."""


# --- R14 compatibility ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What the restore lands on: the failed attempt's environment, topology and code."""

    environment: RuntimeEnvironment | None = None
    topology: Topology | None = None
    code_version: str | None = None


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


@dataclass(frozen=True)
class Selection:
    chosen: Candidate | None
    previous: Candidate | None
    """The next older valid checkpoint: kept pinned as fallback (R15)."""


def select(newest_first: Iterable[Candidate], excluded: Iterable[str] = ()) -> Selection:
    """The newest valid checkpoint not excluded (failed to load before), and the one after it."""
    skip = set(excluded)
    picked: list[Candidate] = []
    for c in newest_first:
        if c.state is CheckpointState.VALID and c.checkpoint_id not in skip and c.step is not None:
            picked.append(c)
            if len(picked) == 2:
                break
    return Selection(picked[0] if picked else None, picked[1] if len(picked) > 1 else None)


def plan_id(job_id: str, run_id: str, failed_attempt: int) -> str:
    """One plan per failure: the same failure, heard twice or by two replicas, names one plan."""
    return str(uuid.uuid5(PLAN_NAMESPACE, f"{job_id}|{run_id}|{failed_attempt}"))


# --- recompute range (R10) -----------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One progress report."""

    step: int
    at: datetime
    attempt: int = 1
    data_position: int | None = None
    rng_fingerprint: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)


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


NEXT_STEPS: Mapping[Stop, str] = {
    Stop.RESTART_LOOP: f"{RUNBOOK}#stop-runaway-retries: stop runaway retries",
    Stop.SAME_FAILURE: f"{RUNBOOK}#stop-runaway-retries: stop runaway retries",
    Stop.FALLBACKS_EXHAUSTED: f"{RUNBOOK}#choose-rollback-version: choose a rollback version",
    Stop.STORAGE_ERRORS: f"{RUNBOOK}#check-storage: check storage before any restore",
    Stop.COMPATIBILITY_UNKNOWN: f"{RUNBOOK}#prepare-environment: prepare the restore environment",
    Stop.NO_VALID_CHECKPOINT: f"{RUNBOOK}#choose-rollback-version: choose a rollback version",
    Stop.UNRECLAIMABLE: f"{RUNBOOK}#reclaim-leftovers: reclaim leftovers by hand",
}


@dataclass(frozen=True)
class Escalation:
    reason: Stop
    detail: str

    @property
    def next_step(self) -> str:
        return NEXT_STEPS[self.reason]


@dataclass(frozen=True)
class Failure:
    attempt: int
    at: datetime
    signature: str | None = None
    infrastructure: bool = False


@dataclass(frozen=True)
class History:
    """What the coordinator remembers of a job, newest last where ordered."""

    restarts: Sequence[datetime] = ()
    """When each automatic restore was planned."""
    failures: Sequence[Failure] = ()
    """The latest failures in attempt order (the current one included)."""
    storage_errors: Sequence[datetime] = ()
    """Infrastructure-side failures (job failures and load failures)."""
    fallbacks: int = 0
    """Load failures already answered with an older checkpoint in this chain."""


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


@dataclass(frozen=True)
class Pin:
    checkpoint_id: str
    reason: str
    plan_id: str
    restored_step: int
    attempt: int
    """The resumed attempt: its own newer valid checkpoint releases the pin."""


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
