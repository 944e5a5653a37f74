"""Checkpoints as the registry knows them, and the manual actions on one checkpoint
(quarantine, release, pin, unpin): decided by `ckpt_ha.ops.actions`, published as operator
events, returned once the registrar has recorded them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import TierChoice
from ckpt_ha.ops import actions, manual
from ckpt_ha.ops.errors import CheckpointNotFound
from ckpt_ha.registry.redis_registry import Registry


@dataclass(frozen=True)
class JobCheckpoints:
    job_id: str
    records: list[CheckpointRecord]
    """Newest step first."""
    owner: str | None
    tier: TierChoice


async def of_job(
    registry: Registry, job_id: str, state: CheckpointState | None = None
) -> JobCheckpoints:
    records = await registry.by_job(job_id, state=state)
    return JobCheckpoints(
        job_id, records, await registry.owner(job_id), await registry.tier_of(job_id)
    )


@dataclass(frozen=True)
class CheckpointView:
    record: CheckpointRecord
    tier: TierChoice


async def show(registry: Registry, checkpoint_id: str) -> CheckpointView:
    record = await registry.get(checkpoint_id)
    if record is None:
        raise CheckpointNotFound(checkpoint_id)
    return CheckpointView(record, await registry.tier_of(record.job_id))


Decide = Callable[[CheckpointRecord], EventData]


async def act(
    registry: Registry,
    publisher: Publisher,
    checkpoint_id: str,
    decide: Decide,
    *,
    now: datetime,
    timeout_s: float = manual.RECORD_WAIT_S,
) -> CheckpointRecord:
    """Decide on the current record (`actions.ActionRefused` when not allowed), publish the
    operator event in the checkpoint's trace, return the record that holds it."""
    record = await registry.get(checkpoint_id)
    if record is None:
        raise CheckpointNotFound(checkpoint_id)
    data = decide(record)
    [event_id] = await manual.publish(publisher, [data], now=now, record=record)
    return await manual.recorded(registry, record.checkpoint_id, event_id, timeout_s=timeout_s)


async def quarantine(
    registry: Registry,
    publisher: Publisher,
    checkpoint_id: str,
    *,
    reason: str,
    actor: str,
    now: datetime,
) -> CheckpointRecord:
    """Take a checkpoint out of the restore candidates by hand."""
    return await act(
        registry,
        publisher,
        checkpoint_id,
        lambda r: actions.quarantine(r, reason, actor),
        now=now,
    )


async def release(
    registry: Registry,
    publisher: Publisher,
    checkpoint_id: str,
    *,
    reason: str,
    actor: str,
    now: datetime,
) -> CheckpointRecord:
    """Send a quarantined checkpoint back to verification (valid again only if it passes)."""
    return await act(
        registry, publisher, checkpoint_id, lambda r: actions.release(r, reason, actor), now=now
    )


async def pin(
    registry: Registry,
    publisher: Publisher,
    checkpoint_id: str,
    *,
    by: str,
    reason: str,
    actor: str,
    now: datetime,
) -> CheckpointRecord:
    """Keep a checkpoint for an evaluation or a candidate model; retention honours it."""
    return await act(
        registry, publisher, checkpoint_id, lambda r: actions.pin(r, by, reason, actor), now=now
    )


async def unpin(
    registry: Registry,
    publisher: Publisher,
    checkpoint_id: str,
    *,
    by: str,
    reason: str,
    actor: str,
    now: datetime,
) -> CheckpointRecord:
    return await act(
        registry, publisher, checkpoint_id, lambda r: actions.unpin(r, by, reason, actor), now=now
    )
