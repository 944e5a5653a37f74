"""Closing a resume: ``checkpoint.registered`` releases the R15 pins a newer valid checkpoint of
the resumed attempt makes useless; ``resume.verified`` reclaims the failed attempt's leftovers
(R11) and closes the resume (or escalates what could not be reclaimed)."""

from __future__ import annotations

import logging

from ckpt_ha.contracts import Envelope
from ckpt_ha.contracts.checkpoint import CheckpointRegisteredV1
from ckpt_ha.contracts.resume import ResumeVerifiedV1
from ckpt_ha.restore_coordinator import adapters, domain
from ckpt_ha.restore_coordinator.handlers.outbox import Outbox
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.ports import CheckpointReads, ObjectStore, RestoreState
from ckpt_ha.restore_coordinator.projection import RestoreProjection

log = logging.getLogger("ckpt_ha.restore_coordinator")


class Closings:
    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        registry: CheckpointReads,
        store: ObjectStore,
        outbox: Outbox,
        metrics: RestoreMetrics,
    ) -> None:
        self.state = state
        self.projection = projection
        self.registry = registry
        self.store = store
        self.outbox = outbox
        self.metrics = metrics

    async def on_registered(self, event: Envelope[CheckpointRegisteredV1]) -> None:
        d = event.data
        ids = await self.projection.registered(event)
        if ids:
            log.info("%s: unpinned %s after %s registered", d.job_id, ids, d.checkpoint_id)

    async def on_verified(self, event: Envelope[ResumeVerifiedV1]) -> None:
        d = event.data
        plan = await self.state.plan(d.plan_id)
        if plan is None:
            log.warning("resume.verified for unknown plan %s: nothing to close", d.plan_id)
            return
        refused = domain.foreign(d.job_id, d.checkpoint_id, event.event_type, plan_job=plan.job_id)
        if refused is not None:
            raise refused
        records = await self.registry.by_job(d.job_id)
        left = domain.leftovers(
            [adapters.candidate(r) for r in records],
            run_id=plan.failed_run_id,
            attempt=plan.failed_attempt,
            failed_at=plan.failed_at,
        )
        reclaimed, unreclaimable = await adapters.reclaim(self.store, d.job_id, left, records)
        for outcome, n in (("cleaned", len(reclaimed)), ("unreclaimable", len(unreclaimable))):
            self.metrics.reclaimed.labels(self.metrics.service, outcome).inc(n)
        await self.state.release(d.job_id, plan.failed_attempt)
        closure = domain.closure(d.job_id, d.plan_id, reclaimed, unreclaimable)
        if closure.escalation is not None:
            self.metrics.outcome(
                d.job_id,
                "escalated",
                at=self.outbox.clock().timestamp(),
                reason=closure.escalation.reason.value,
            )
        await self.outbox.publish_caused_by(event, closure.events)
