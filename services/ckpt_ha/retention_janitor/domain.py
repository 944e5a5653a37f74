"""Retention decisions (R6, R13, R15): what to expire, what to delete, what to keep and why.

Pure: no I/O, no clock. `plan` is the one function both the dry run (``ckpt-ha retention plan``)
and the real janitor round call, so the real run does exactly what the dry run showed.

Order of the rules for one checkpoint:

1. A protection (a pin, a restore plan or resume in progress, the R15 fallback pair, the job's
   last valid checkpoint) keeps it, whatever else applies; the decision names the reference.
2. An expired checkpoint is deleted once its grace period is over (bytes first, then the
   tombstone event); before that it waits.
3. A valid checkpoint is kept by its tier's keep-last, keep-every-K-th-step and keep-best rules
   (the last two only up to the maximum age); otherwise it expires.
4. Corrupt and quarantined checkpoints expire after the tier's quarantine retention, write-failed
   (partial) ones after its failed-write retention.
5. Checkpoints still being written or verified are never touched, and nothing expires within
   `SETTLE` of its last transition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import Tier
from ckpt_ha.retention_janitor import resumes
from ckpt_ha.retention_janitor.resumes import JobResumes

SETTLE = timedelta(minutes=10)
"""No checkpoint expires within this time of its last transition. The watcher and the writer
both announce a write, and a late duplicate report must still find the checkpoint where it left
it (after expiry it would be an illegal transition); nor is a checkpoint expired the moment a
burst of newer ones is registered."""


class Action(StrEnum):
    KEEP = "keep"
    EXPIRE = "expire"
    WAIT = "wait"
    """Expired, grace period not over yet."""
    DELETE = "delete"


class ProtectionKind(StrEnum):
    PIN = "pin"
    RESTORE_PLAN = "restore_plan"
    RESUME = "resume"
    FALLBACK = "fallback"
    LAST_VALID = "last_valid"


@dataclass(frozen=True)
class Protection:
    """A reference that keeps a checkpoint, whatever the retention rules say."""

    checkpoint_id: str
    kind: ProtectionKind
    ref: str
    """What exactly: ``eval:mmlu``, ``plan p-123``, ``attempt 3 of plan p-123``."""

    def describe(self) -> str:
        return f"{self.kind.value} ({self.ref})"


@dataclass(frozen=True)
class Decision:
    checkpoint_id: str
    job_id: str
    step: int | None
    state: S
    action: Action
    reason: str
    tier: str
    policy: str
    uri: str
    protected_by: tuple[Protection, ...] = ()
    grace_until: datetime | None = None
    """For EXPIRE: when deletion may start; for WAIT: when it will."""

    def to_json(self) -> dict[str, object]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "job_id": self.job_id,
            "step": self.step,
            "state": self.state.value,
            "action": self.action.value,
            "reason": self.reason,
            "tier": self.tier,
            "policy": self.policy,
            "uri": self.uri,
            "protected_by": [{"kind": p.kind.value, "ref": p.ref} for p in self.protected_by],
            "grace_until": self.grace_until.isoformat() if self.grace_until else None,
        }


@dataclass(frozen=True)
class JobView:
    """Everything retention needs to know about one job (read by the adapter, decided here)."""

    job_id: str
    tier: Tier
    records: Sequence[CheckpointRecord]
    protections: Sequence[Protection] = field(default_factory=tuple)
    """References from outside the registry record: R15 pins, restore plans, resumes."""


def record_protections(record: CheckpointRecord) -> list[Protection]:
    """Pins held in the record itself (``ckpt-ha pin``)."""
    return [Protection(record.checkpoint_id, ProtectionKind.PIN, p.by) for p in record.pins]


def resume_protections(view: JobResumes, now: datetime, keep_s: float) -> list[Protection]:
    """What the job's restores reference, from the janitor's view of them: R15 pins first (a
    resumed job's restored-from and fallback checkpoints, by checkpoint id), then R6 the
    checkpoint of each restore plan without a verdict (by plan id): a restore plan, or a
    resume in progress once the resumed attempt started."""
    found = [
        Protection(p.checkpoint_id, ProtectionKind.FALLBACK, f"{p.reason or 'pinned'} for plan "
                   f"{p.plan_id or '?'}")
        for p in resumes.pins(view)
    ]  # fmt: skip
    for p in resumes.in_progress(view, now, keep_s):
        plan = p.plan
        if p.resuming:
            ref = f"attempt {plan.attempt} of plan {plan.plan_id}"
            found.append(Protection(plan.checkpoint_id, ProtectionKind.RESUME, ref))
        else:
            found.append(
                Protection(plan.checkpoint_id, ProtectionKind.RESTORE_PLAN, f"plan {plan.plan_id}")
            )
    return found


def still_deletable(record: CheckpointRecord | None) -> bool:
    """A planned deletion goes ahead only if the checkpoint is still expired and unpinned (the
    plan was read a moment ago; a pin or a state change since then wins)."""
    return record is not None and record.state is S.EXPIRED and not record.pins


def tombstone_reason(reason: str, kept: Sequence[str]) -> str:
    """The deletion's reason, and what of its bytes was kept because they are another live
    checkpoint's (R6: the tombstone says what was deleted and what was not, and why)."""
    return "; ".join((reason, *kept))


def cold_tombstones(
    records: Iterable[CheckpointRecord], now: datetime, hot: timedelta
) -> list[CheckpointRecord]:
    """The tombstones (deleted checkpoints' records) whose deletion is older than ``hot``: they
    leave the registry's hot index for the archive, oldest deletion first (R6: moved, never
    dropped). Nothing moves when ``hot`` is zero."""
    if hot <= timedelta(0):
        return []
    cold = [
        r for r in records
        if r.state is S.DELETED and r.tombstone is not None and r.tombstone.at <= now - hot
    ]  # fmt: skip
    return sorted(cold, key=lambda r: (r.tombstone.at if r.tombstone else now, r.checkpoint_id))


def last_valid(records: Iterable[CheckpointRecord]) -> CheckpointRecord | None:
    """The job's newest valid checkpoint by step: never deleted by policy."""
    valid = [r for r in records if r.state is S.VALID and r.step is not None]
    return max(valid, key=lambda r: (r.step, r.created_at), default=None)


def _kept_by_rules(valid: Sequence[CheckpointRecord], tier: Tier, now: datetime) -> dict[str, str]:
    """Valid checkpoint id → the retention rule that keeps it (absent: nothing keeps it)."""
    newest = sorted(valid, key=lambda r: (r.step or 0, r.created_at), reverse=True)
    kept: dict[str, str] = {}
    for r in newest[: tier.keep_last]:
        kept[r.checkpoint_id] = f"among the newest {tier.keep_last} valid (keep_last)"

    def young(r: CheckpointRecord) -> bool:
        return tier.max_age_s is None or now - r.created_at <= timedelta(seconds=tier.max_age_s)

    if tier.keep_best is not None:
        best = tier.keep_best
        scored = [r for r in valid if best.metric in r.metrics and young(r)]
        sign = 1.0 if best.direction == "min" else -1.0
        scored.sort(key=lambda r: (sign * r.metrics[best.metric], -(r.step or 0)))
        for r in scored[: best.count]:
            kept.setdefault(
                r.checkpoint_id,
                f"best {best.count} by {best.direction} {best.metric}"
                f" ({r.metrics[best.metric]:g}) (keep_best)",
            )
    if tier.keep_every:
        for r in valid:
            if r.step is not None and r.step % tier.keep_every == 0 and young(r):
                kept.setdefault(
                    r.checkpoint_id, f"step is a multiple of {tier.keep_every} (keep_every)"
                )
    return kept


def plan_job(job: JobView, now: datetime) -> list[Decision]:
    """The decision for every checkpoint of one job that is not deleted, newest step first."""
    tier, policy = job.tier, job.tier.policy()
    records = [r for r in job.records if r.state is not S.DELETED]
    protections: dict[str, list[Protection]] = {}
    for p in job.protections:
        protections.setdefault(p.checkpoint_id, []).append(p)
    for r in records:
        protections.setdefault(r.checkpoint_id, []).extend(record_protections(r))
    last = last_valid(records)
    if last is not None:
        protections.setdefault(last.checkpoint_id, []).append(
            Protection(last.checkpoint_id, ProtectionKind.LAST_VALID, f"step {last.step}")
        )
    valid = [r for r in records if r.state is S.VALID]
    kept = _kept_by_rules(valid, tier, now)
    out: list[Decision] = []
    for r in sorted(records, key=lambda r: (r.step or -1, r.created_at), reverse=True):

        def decide(
            action: Action,
            reason: str,
            grace: datetime | None = None,
            by: Sequence[Protection] = (),
            r: CheckpointRecord = r,
        ) -> Decision:
            return Decision(
                checkpoint_id=r.checkpoint_id,
                job_id=r.job_id,
                step=r.step,
                state=r.state,
                action=action,
                reason=reason,
                tier=tier.name,
                policy=policy,
                uri=r.uri,
                protected_by=tuple(by),
                grace_until=grace,
            )

        held = tuple(dict.fromkeys(protections.get(r.checkpoint_id, ())))
        if r.state in (S.WRITING, S.PENDING_VERIFICATION):
            out.append(decide(Action.KEEP, f"{r.state.value}: not decided yet"))
            continue
        if r.state is S.EXPIRED:
            grace = r.expiry.grace_until if r.expiry is not None else None
            if held:
                why = "expired, but protected by " + ", ".join(p.describe() for p in held)
                out.append(decide(Action.KEEP, why, grace, held))
            elif grace is not None and now < grace:
                out.append(decide(Action.WAIT, f"expired; grace period until {grace}", grace))
            else:
                why = r.expiry.reason if r.expiry is not None else "expired"
                out.append(decide(Action.DELETE, f"grace period over ({why})", grace))
            continue
        rule = _expiry_rule(r, tier, kept, now)
        if rule is None:
            out.append(decide(Action.KEEP, kept.get(r.checkpoint_id, "within retention"), by=held))
        elif held:
            why = f"protected by {', '.join(p.describe() for p in held)} (else: {rule})"
            out.append(decide(Action.KEEP, why, by=held))
        else:
            out.append(decide(Action.EXPIRE, rule, now + timedelta(seconds=tier.grace_s)))
    return out


def in_state_since(r: CheckpointRecord) -> datetime:
    """When the checkpoint entered its current state (a pin or unpin is no transition)."""
    since, previous = r.updated_at, None
    for h in r.history:
        if h.state is not previous:
            since, previous = h.at, h.state
    return since


def _expiry_rule(
    r: CheckpointRecord, tier: Tier, kept: Mapping[str, str], now: datetime
) -> str | None:
    """Why retention would expire this checkpoint (None: it is kept by the rules)."""
    age = now - in_state_since(r)
    if age < SETTLE:
        return None
    if r.state is S.VALID:
        if r.checkpoint_id in kept:
            return None
        return (
            f"not among the newest {tier.keep_last} valid, not kept by keep_every/keep_best"
            " or older than max_age"
        )
    if r.state in (S.CORRUPT, S.QUARANTINED, S.FENCED):
        # A fenced commit (a stale writer's, R17) is kept for a look like a quarantined one,
        # then expired and deleted with a tombstone like any other.
        if age > timedelta(seconds=tier.quarantine_keep_s):
            return f"{r.state.value} for longer than the tier's quarantine retention"
        return None
    if r.state is S.WRITE_FAILED:
        if age > timedelta(seconds=tier.failed_keep_s):
            return "partial write kept longer than the tier's failed-write retention"
        return None
    return None


def plan(jobs: Iterable[JobView], now: datetime) -> list[Decision]:
    """Decisions for every job, in job order: what the janitor will do, and why."""
    return [d for job in sorted(jobs, key=lambda j: j.job_id) for d in plan_job(job, now)]


def actionable(decisions: Iterable[Decision]) -> list[Decision]:
    """The decisions a round carries out (expire, delete)."""
    return [d for d in decisions if d.action in (Action.EXPIRE, Action.DELETE)]


def unknown_objects(
    keys: Iterable[str], known: Iterable[str], writing: Iterable[str] = ()
) -> list[str]:
    """Storage keys no registry record claims (under its location or its quarantine copy).

    ``known``: the keys of every record's location, deleted ones included (their leftovers are
    not unknown, the round deletes them). A key equal to a location or under ``<location>/``
    belongs to it."""
    roots = sorted({k.rstrip("/") for k in (*known, *writing) if k})
    return [k for k in keys if not any(k == r or k.startswith(r + "/") for r in roots)]
