"""Protection tiers (R13): what a job's checkpoints cost and how long they are kept.

Pure: one table and one rule for which tier a job has. A tier is explicit and visible: a job's
tier comes from a recorded choice (``ckpt-ha tier set``, a `TierChosenV1` event with actor and
reason), else from its own ``job.started`` declaration, else it is the cheapest. Nothing is
inherited from another job or a project, so no job gets an expensive tier by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ckpt_ha.contracts.job import JobStartedV1, JobStartedV2

DAY = 86400.0
MISSED_HEARTBEATS = 4
"""Heartbeats an attempt must miss in a row (with no progress either) before it is lost by
default: one lost or late heartbeat, or a supervisor's pause of a few seconds, is not a lost
host; four in a row (40 s at the default 10 s) is."""
LOST_FLOOR_S = 30.0
"""No default deadline is shorter, however often the heartbeats come."""


@dataclass(frozen=True)
class KeepBest:
    """Keep the ``count`` best checkpoints by a declared metric (from `CheckpointCommittedV1`)."""

    metric: str
    direction: Literal["min", "max"]
    count: int = 1


@dataclass(frozen=True)
class Tier:
    name: str
    cost: int
    """Rank: higher costs more (storage, replication). The default is the lowest."""
    interval_s: float
    """Target seconds between checkpoints (the interval policy; `policy advise` refines it)."""
    keep_last: int
    """The newest N valid checkpoints are always kept."""
    keep_every: int | None
    """Also keep valid checkpoints whose step is a multiple of this (until ``max_age_s``)."""
    keep_best: KeepBest | None
    max_age_s: float | None
    """Valid checkpoints beyond keep-last expire after this age even if another rule kept them."""
    quarantine_keep_s: float
    """How long corrupt and quarantined checkpoints are kept for a human to look at."""
    failed_keep_s: float
    """How long partial (write-failed) checkpoints are kept."""
    grace_s: float
    """Between expiry and deletion: the window in which a pin still saves the bytes."""
    replicate: bool
    """Each valid checkpoint is copied to the replica root the deployment names for this tier
    (the integrity-checker's ``replica_roots``) and restored from there when its primary is
    gone (`ckpt_ha.core.copies`)."""
    rpo_s: float = 7200.0
    """The recovery-point objective: the newest valid checkpoint of a running job of this tier
    is never older than this (`CkptHaNoRecentValidCheckpoint`; exported as
    ``ckpt_ha_tier_rpo_seconds``). Two intervals by default: one slow or failed checkpoint
    does not page, two in a row do."""
    copy_rpo_s: float = 1800.0
    """The recovery-point objective of the copies: a valid checkpoint without its copy for
    longer than this raises `ReplicationLagging` (a tier that replicates)."""
    lost_after_s: float = 300.0
    """Ceiling of the default heartbeat deadline (`lost_after`): an attempt that promised
    heartbeats (``job.started`` v2) and declared no ``deadline_s`` is lost after
    `MISSED_HEARTBEATS` missed heartbeats (at least `LOST_FLOOR_S`), never later than this."""

    def policy(self) -> str:
        """One line naming the rules, recorded on every expiry and tombstone."""
        parts = [f"keep_last={self.keep_last}"]
        if self.keep_every:
            parts.append(f"keep_every={self.keep_every}")
        if self.keep_best:
            b = self.keep_best
            parts.append(f"keep_best={b.count}x{b.direction}({b.metric})")
        if self.max_age_s is not None:
            parts.append(f"max_age={span(self.max_age_s)}")
        parts.append(f"quarantine={span(self.quarantine_keep_s)}")
        parts.append(f"failed={span(self.failed_keep_s)}")
        parts.append(f"grace={span(self.grace_s)}")
        return f"{self.name}: " + " ".join(parts)


def span(seconds: float) -> str:
    """``3600`` → ``1h``, ``604800`` → ``7d``: for people; machines get seconds."""
    if seconds >= DAY and seconds % DAY == 0:
        return f"{int(seconds // DAY)}d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


TIERS: Mapping[str, Tier] = {
    t.name: t
    for t in (
        Tier(
            name="exploratory",
            cost=0,
            interval_s=3600.0,
            keep_last=2,
            keep_every=None,
            keep_best=None,
            max_age_s=7 * DAY,
            quarantine_keep_s=1 * DAY,
            failed_keep_s=6 * 3600.0,
            grace_s=3600.0,
            replicate=False,
            rpo_s=7200.0,
            lost_after_s=300.0,
        ),
        Tier(
            name="standard",
            cost=1,
            interval_s=1800.0,
            keep_last=3,
            keep_every=10000,
            keep_best=KeepBest("val_loss", "min", 1),
            max_age_s=30 * DAY,
            quarantine_keep_s=7 * DAY,
            failed_keep_s=1 * DAY,
            grace_s=1 * DAY,
            replicate=False,
            rpo_s=3600.0,
            lost_after_s=120.0,
        ),
        Tier(
            name="critical",
            cost=2,
            interval_s=900.0,
            keep_last=5,
            keep_every=5000,
            keep_best=KeepBest("val_loss", "min", 3),
            max_age_s=180 * DAY,
            quarantine_keep_s=30 * DAY,
            failed_keep_s=7 * DAY,
            grace_s=7 * DAY,
            replicate=True,
            rpo_s=1800.0,
            copy_rpo_s=1800.0,
            lost_after_s=60.0,
        ),
    )
}
DEFAULT_TIER = min(TIERS.values(), key=lambda t: t.cost).name
"""The cheapest tier: what a job gets when nothing explicit says otherwise."""


class UnknownTier(ValueError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown tier {name!r} (known: {', '.join(TIERS)})")


def get_tier(name: str) -> Tier:
    try:
        return TIERS[name]
    except KeyError:
        raise UnknownTier(name) from None


@dataclass(frozen=True)
class TierChoice:
    """The job's tier and where it came from (shown next to the tier everywhere)."""

    tier: Tier
    source: Literal["chosen", "declared", "default"]
    detail: str


def declared_tier(started: JobStartedV1) -> str | None:
    """The tier a ``job.started`` declares (its ``tier``, else its policy's; None: none): what
    the retention-janitor records live and a registry rebuild replays."""
    return started.tier or (started.policy.tier if started.policy is not None else None)


def lost_after(started: JobStartedV1) -> float | None:
    """The heartbeat deadline of the attempt this ``job.started`` began (R9's lost attempt):
    its own ``deadline_s``, else `MISSED_HEARTBEATS` of its heartbeat intervals (at least
    `LOST_FLOOR_S`), capped by its declared tier's `Tier.lost_after_s` (an unknown or missing
    tier: the cheapest one's, as for retention). None: the attempt promised no heartbeat (a
    v1 start, or ``heartbeat_s`` None), so silence proves nothing and it is never lost.

    The deadline follows the heartbeat (issue 28): at the default 10 s an attempt is lost 40 s
    after its last sign of life, not after its tier's 300 s. A sign of life is a heartbeat of
    its supervisor or a progress report of its training: the two come from different
    processes, so a stalled supervisor whose training goes on reporting is not lost, and the
    coordinator declares nothing while its own consumers have a backlog (its own pause).

    From the event alone (no setting): the coordinator's live handling and a rebuild from the
    stream resolve the same deadline."""
    if not isinstance(started, JobStartedV2) or started.heartbeat_s is None:
        return None
    if started.deadline_s is not None:
        return float(started.deadline_s)
    ceiling = TIERS.get(declared_tier(started) or DEFAULT_TIER, TIERS[DEFAULT_TIER]).lost_after_s
    return min(ceiling, max(MISSED_HEARTBEATS * float(started.heartbeat_s), LOST_FLOOR_S))


def resolve_tier(chosen: Mapping[str, str] | None, declared: str | None) -> TierChoice:
    """The job's tier. ``chosen``: its latest recorded choice (``tier``, ``actor``, ``reason``),
    which wins; ``declared``: the tier its own latest ``job.started`` named. An unknown name never
    falls upwards: the job gets the cheapest tier and the detail says why."""
    if chosen is not None and chosen.get("tier") in TIERS:
        who = chosen.get("actor", "?")
        return TierChoice(TIERS[chosen["tier"]], "chosen", f"set by {who}: {chosen.get('reason')}")
    if declared is not None and declared in TIERS:
        return TierChoice(TIERS[declared], "declared", "declared by the job at start")
    if declared is not None:
        why = f"declared tier {declared!r} is unknown; the cheapest applies"
        return TierChoice(TIERS[DEFAULT_TIER], "default", why)
    return TierChoice(TIERS[DEFAULT_TIER], "default", "no tier chosen or declared")
