"""R14: the checkpoint's identity against the restore target (what the failed attempt's
``job.started`` said it runs on, then what the attempt that loads the plan says: `reshape`),
under the job's declared rules."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ckpt_ha.contracts.checkpoint import (
    CheckpointIdentity,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    CompatibilityRule,
    JobPolicy,
)
from ckpt_ha.contracts.resume import (
    Compatibility,
    ResumeMode,
)
from ckpt_ha.restore_coordinator.domain.selection import Candidate
from ckpt_ha.restore_coordinator.domain.shapes import across
from ckpt_ha.restore_coordinator.records import Started, Target

MISSING = "<none>"
"""How a field neither side recorded, or only one side recorded, is shown in reasons."""


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


def target_changes(before: Target, after: Target) -> list[Difference]:
    """What differs between two restore targets (two attempts' starts), as `differences`
    shows it (``field: before -> after``)."""
    old = _fields(before.environment, before.topology, before.code_version)
    new = _fields(after.environment, after.topology, after.code_version)
    return [
        Difference(n, old.get(n), new.get(n))
        for n in sorted(set(old) | set(new))
        if old.get(n) != new.get(n)
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
    checkpoint_format: str | None = None,
) -> Verdict:
    """R14: identical → exact resume; every difference declared → compatible resume; anything
    else is `unknown`: never resumed, at most a labelled weights-only initialisation when the
    policy allows it. A checkpoint without optimizer state (``training_state=False``) can only
    initialise weights, whatever its compatibility.

    A world-size change no rule declares is decided by the checkpoint's format
    (`shapes.across`): DCP reshards, a native or Trainer checkpoint loads at any world size
    (compatible, the reason says how); another format is unknown, with the next step."""
    diffs = differences(identity, target)
    reasons: list[str] = []
    undeclared: list[Difference] = []
    for diff in diffs:
        rule = rule_for(diff, policy.compatible)
        shape = (
            across(checkpoint_format, identity.topology if identity else None, target.topology)
            if rule is None and diff.field == "topology"
            else None
        )
        if shape is not None and shape.loads:
            reasons.append(f"{diff.text()} ({shape.reason})")
        elif shape is not None:
            undeclared.append(diff)
            reasons.append(f"{diff.text()} (no declared rule; {shape.reason})")
        elif rule is None:
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


def weigh(chosen: Candidate, target: Target, started: Started) -> Verdict:
    """The compatibility verdict of restoring ``chosen`` onto ``target`` under ``started``'s
    policy, with the notes a plan states first: identity taken from the writer's start, a
    restore from a copy."""
    verdict = compatibility(
        chosen.identity,
        target,
        started.policy,
        training_state=chosen.exact_resume is not False,
        checkpoint_format=chosen.format,
    )
    if chosen.inherited_from is not None:
        note = (
            f"identity the checkpoint does not record taken from attempt {chosen.inherited_from}'s "
            "job.started (the attempt that wrote it)"
        )
        verdict = replace(verdict, reasons=(note, *verdict.reasons))
    if chosen.source is not None:
        verdict = replace(verdict, reasons=(chosen.source, *verdict.reasons))
    return verdict
