"""The janitor's round and its consumers: read, `domain.plan`, then do exactly what it says.

A round is level-triggered: it reads the registry and the references afresh, never relies on
having seen an event. Expiry is only an event (the registrar records it). Deletion removes the
bytes first, lists again to see them gone, and only then publishes ``checkpoint.deleted`` (the
tombstone); a storage failure leaves the checkpoint expired and the next round retries, so the
registry never says "deleted" while bytes remain, nor hides that they do.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime

from ckpt_ha.contracts import Envelope, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointRegisteredV1,
)
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.core.locations import LocationNotOwned
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import declared_tier
from ckpt_ha.retention_janitor import adapters, domain
from ckpt_ha.retention_janitor.domain import Action, Decision
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.ports import (
    Clock,
    ObjectStore,
    PinReads,
    Publisher,
    ResumeReads,
    RetentionRegistry,
)
from ckpt_ha.runtime.leader import next_round
from ckpt_ha.storage import StorageError, key_for_uri
from ckpt_ha.telemetry import tracing

__all__ = ["Janitor", "JanitorHandlers", "RoundResult", "plan_round"]

SOURCE = "ckpt-ha/retention-janitor"
ACTOR = "retention-janitor"
log = logging.getLogger("ckpt_ha.retention_janitor")


@dataclass
class RoundResult:
    decisions: list[Decision]
    expired: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    """Checkpoint id → why its deletion did not happen this round (retried next round)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Checkpoint id → why a planned deletion was not carried out (it changed since)."""


async def plan_round(
    registry: RetentionRegistry,
    pins: PinReads,
    resumes: ResumeReads,
    now: datetime,
    jobs: Iterable[str] | None = None,
) -> list[Decision]:
    """What a round would do at ``now`` (``ckpt-ha retention plan``): the same read and the same
    `domain.plan` a real round carries out."""
    views = await adapters.job_views(registry, pins, resumes, jobs)
    return domain.plan(views, now)


class Janitor:
    def __init__(
        self,
        registry: RetentionRegistry,
        pins: PinReads,
        resumes: ResumeReads,
        store: ObjectStore,
        bus: Publisher,
        clock: Clock,
        metrics: RetentionMetrics,
    ) -> None:
        self.registry = registry
        self.pins = pins
        self.resumes = resumes
        self.store = store
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self._lock = asyncio.Lock()

    async def dry_run(self, jobs: Iterable[str] | None = None) -> list[Decision]:
        return await plan_round(self.registry, self.pins, self.resumes, self.clock(), jobs)

    async def run_once(self, jobs: Iterable[str] | None = None) -> RoundResult:
        """One round: plan, then expire and delete exactly what the plan says."""
        async with self._lock:
            decisions = await self.dry_run(jobs)
            result = RoundResult(decisions)
            storage_down: str | None = None
            for d in domain.actionable(decisions):
                if d.action is Action.EXPIRE:
                    await self._expire(d)
                    result.expired.append(d.checkpoint_id)
                elif storage_down is not None:
                    result.failed[d.checkpoint_id] = storage_down
                else:
                    storage_down = await self._delete(d, result)
            if storage_down is not None:
                self.metrics.delete_failures.labels(self.metrics.service).inc(len(result.failed))
                log.warning("deletions stopped this round, retried next round: %s", storage_down)
            if jobs is None:
                self._gauge(decisions)
                if storage_down is None:
                    now = self.clock().timestamp()
                    self.metrics.last_round.labels(self.metrics.service).set(now)
            return result

    async def _expire(self, d: Decision) -> None:
        data = CheckpointExpiredV1(
            job_id=d.job_id,
            checkpoint_id=d.checkpoint_id,
            uri=d.uri,
            reason=d.reason,
            policy=d.policy,
            grace_until=d.grace_until,
            tier=d.tier,
            actor=ACTOR,
        )
        record = await self.registry.get(d.checkpoint_id)
        # In the checkpoint's own trace (linked to this round), like every transition of it.
        with self._in_trace("retention.expire", record, d):
            # Keyed on the checkpoint: a round repeated before the registrar recorded it is
            # deduped.
            await self._publish(data, key=f"expire:{d.checkpoint_id}")
        self.metrics.decisions.labels(self.metrics.service, d.tier, "expire").inc()

    async def _delete(self, d: Decision, result: RoundResult) -> str | None:
        """Delete one expired checkpoint's bytes, then publish its tombstone. Returns why storage
        failed (the round stops deleting), or None."""
        record = await self.registry.get(d.checkpoint_id)
        if record is None or not domain.still_deletable(record):
            result.skipped[d.checkpoint_id] = "changed since the plan was read"
            return None
        if key_for_uri(self.store, record.uri) is None:
            # Never "deleted" while bytes may remain somewhere this janitor cannot reach.
            result.failed[d.checkpoint_id] = f"{record.uri} is outside this janitor's storage root"
            return None
        try:
            removals = await adapters.removals(self.store, self.registry, record)
        except LocationNotOwned as exc:
            # Never delete where the record's job does not own the bytes (a record registered
            # before ownership was checked): a human decides.
            result.skipped[d.checkpoint_id] = str(exc)
            log.warning("not deleting %s: %s", d.checkpoint_id, exc)
            return None
        try:
            removed = await adapters.to_thread_remove(self.store, removals)
        except StorageError as exc:
            result.failed[d.checkpoint_id] = str(exc)
            return str(exc)
        data = CheckpointDeletedV1(
            job_id=d.job_id,
            checkpoint_id=d.checkpoint_id,
            uri=d.uri,
            reason=domain.tombstone_reason(d.reason, removed.notes),
            actor=ACTOR,
            policy=d.policy,
            tier=d.tier,
            objects_deleted=removed.deleted,
        )
        with self._in_trace("retention.delete", record, d):
            await self._publish(data, key=f"delete:{d.checkpoint_id}")
        self.metrics.decisions.labels(self.metrics.service, d.tier, "delete").inc()
        result.deleted.append(d.checkpoint_id)
        return None

    def _gauge(self, decisions: list[Decision]) -> None:
        counts = Counter(
            (d.tier, p.kind.value)
            for d in decisions
            if d.action is Action.KEEP
            for p in d.protected_by[:1]
        )
        self.metrics.protected.clear()
        for (tier, kind), n in counts.items():
            self.metrics.protected.labels(self.metrics.service, tier, kind).set(n)
        states = Counter((d.tier, d.state.value) for d in decisions)
        self.metrics.checkpoints.clear()
        for (tier, state), n in states.items():
            self.metrics.checkpoints.labels(self.metrics.service, tier, state).set(n)

    @staticmethod
    def _in_trace(
        name: str, record: CheckpointRecord | None, d: Decision
    ) -> AbstractContextManager[object]:
        return tracing.continue_trace(
            name,
            record.traceparent if record is not None else None,
            tracestate=record.tracestate if record is not None else None,
            attributes={
                "ckpt_ha.job_id": d.job_id,
                "ckpt_ha.checkpoint_id": d.checkpoint_id,
                "ckpt_ha.tier": d.tier,
                "ckpt_ha.reason": d.reason[:200],
            },
        )

    async def _publish(self, data: CheckpointExpiredV1 | CheckpointDeletedV1, key: str) -> None:
        await self.bus.publish(build(data, source=SOURCE, time=self.clock(), key=key))

    async def run(self, interval_s: float) -> None:
        """Rounds forever; an outage ends a round early and the next one retries."""
        while True:
            try:
                await self.run_once()
            except Exception:  # one failed round must not stop the janitor
                log.exception("retention round failed; retrying in %.0f s", interval_s)
            await next_round(interval_s)


class JanitorHandlers:
    def __init__(self, janitor: Janitor) -> None:
        self.janitor = janitor

    async def on_registered(self, event: Envelope[CheckpointRegisteredV1]) -> None:
        """A new valid checkpoint may push an older one out of its tier's keep-last."""
        result = await self.janitor.run_once([event.data.job_id])
        if result.failed:
            log.warning("%s: deletions retried next round: %s", event.data.job_id, result.failed)

    async def on_started(self, event: Envelope[JobStartedV1]) -> None:
        """Record the tier the job declared (an explicit ``tier set`` still wins over it)."""
        await self.janitor.registry.declare_tier(event.data.job_id, declared_tier(event.data))
