"""Protection tiers (R13): the tier table, a job's tier and where it comes from, and the
explicit, recorded tier choice."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckpt_ha.bus.port import Publisher
from ckpt_ha.core.records import TierRecord
from ckpt_ha.core.tiers import TIERS, TierChoice
from ckpt_ha.ops import actions, manual
from ckpt_ha.ops.errors import NotRecorded
from ckpt_ha.registry.redis_registry import Registry


def table() -> list[dict[str, Any]]:
    """Every tier's rules, cheapest first (``*_s`` fields in seconds)."""
    return [
        {
            "tier": t.name,
            "cost": t.cost,
            "interval_s": t.interval_s,
            "rpo_s": t.rpo_s,
            "keep_last": t.keep_last,
            "keep_every": t.keep_every,
            "keep_best": (
                f"{t.keep_best.count}x{t.keep_best.direction}({t.keep_best.metric})"
                if t.keep_best
                else None
            ),
            "max_age_s": t.max_age_s,
            "quarantine_keep_s": t.quarantine_keep_s,
            "failed_keep_s": t.failed_keep_s,
            "grace_s": t.grace_s,
            "replicate": t.replicate,
        }
        for t in sorted(TIERS.values(), key=lambda t: t.cost)
    ]


@dataclass(frozen=True)
class JobTier:
    job_id: str
    choice: TierChoice
    log: list[TierRecord]


async def of_job(registry: Registry, job_id: str) -> JobTier:
    return JobTier(job_id, await registry.tier_of(job_id), await registry.tier_log(job_id))


@dataclass(frozen=True)
class TierChange:
    before: TierChoice
    chosen: TierRecord


async def choose(
    registry: Registry,
    publisher: Publisher,
    job_id: str,
    tier: str,
    *,
    reason: str,
    actor: str,
    now: datetime,
    timeout_s: float = manual.RECORD_WAIT_S,
) -> TierChange:
    """Record an explicit tier choice for a known job; returns it once the registrar has."""
    current = await registry.tier_of(job_id)
    known = job_id in await registry.jobs()
    data = actions.choose_tier(job_id, current, tier, reason, actor, known_job=known)
    [event_id] = await manual.publish(publisher, [data], now=now)

    async def chosen() -> TierRecord | None:
        record = await registry.chosen_tier(job_id)
        return record if record is not None and record.event_id == event_id else None

    record = await manual.until(chosen, timeout_s=timeout_s)
    if record is None:
        raise NotRecorded("it", timeout_s, event_id=event_id)
    return TierChange(current, record)
