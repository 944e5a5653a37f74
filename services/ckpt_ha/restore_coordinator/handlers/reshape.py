"""One unit of work: the plan re-stated for the attempt that loads it (`domain.replan`).

A plan is decided when an attempt fails, against what that attempt ran on. The attempt that
carries it out says what it runs on in its own ``job.started`` (naming the plan): when that
differs (another world size after a takeover on fewer nodes, another image or code), the plan's
checkpoint is weighed again for it. A changed verdict replaces the failed attempt's decision
(the same plan id, its reasons saying why: "reshard 2→1") and is published; a loader that
cannot load it at its shape gets the escalation instead, and its supervisor stops it. The same
start handled again finds the stored re-plan and changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ckpt_ha.contracts import CATALOG, Envelope
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.restore_coordinator import adapters, domain
from ckpt_ha.restore_coordinator.handlers.outbox import Outbox
from ckpt_ha.restore_coordinator.ports import CheckpointReads, RestoreState
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.records import DecisionRecord, Started

INHERIT_WINDOW = 16
"""Attempts looked back at for the one that wrote a checkpoint without its own identity."""
log = logging.getLogger("ckpt_ha.restore_coordinator")


def stored_plan(decision: DecisionRecord | None) -> ResumePlannedV2 | None:
    """The ``resume.planned`` a stored decision published (None: an escalation, or none)."""
    for raw in decision.events if decision is not None else ():
        data = CATALOG.decode(raw.encode()).data
        if isinstance(data, ResumePlannedV2):
            return data
    return None


class Replans:
    """``job.started`` of a resumed attempt: its plan re-stated for it, when its shape differs
    from the failed attempt's."""

    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        registry: CheckpointReads,
        outbox: Outbox,
    ) -> None:
        self.state = state
        self.projection = projection
        self.registry = registry
        self.outbox = outbox

    async def on_started(self, event: Envelope[JobStartedV1]) -> None:
        d = event.data
        if d.plan_id is None:
            return
        plan = domain.own_plan(await self.state.plan(d.plan_id), d.job_id)
        if plan is None or plan.attempt != d.attempt:
            return
        failed = plan.failed_attempt
        decision = await self.state.decision(d.job_id, failed)
        planned = stored_plan(decision)
        assumed = await self.state.started(d.job_id, failed)
        if decision is None or planned is None or assumed is None:
            return
        loading = Started.of(d, event.time)
        if not domain.target_changes(assumed.target(), loading.target()):
            return
        record = await self.registry.get(plan.checkpoint_id)
        if record is None:
            return
        chosen = await self._inherited(d.job_id, failed, adapters.candidate(record))
        if planned.checkpoint_uri != chosen.uri:  # the plan restores from a verified copy
            chosen = domain.from_copy(replace(chosen, copies=(planned.checkpoint_uri,)),
                                      "was not restorable when the plan was made")  # fmt: skip
        point = await self.state.point_at(d.job_id, plan.step)
        found = domain.replan(
            planned,
            chosen,
            assumed.target(),
            loading,
            data_position=point.data_position if point is not None else None,
        )
        if found is None:
            await self.outbox.publish_decision(d.job_id, failed, decision)  # after a crash
            return
        log.info("%s: plan %s re-stated for attempt %s", d.job_id, plan.plan_id, d.attempt)
        envelopes = [self.outbox.envelope(x, f"replan|{event.id}") for x in found.events]
        stored = await self.projection.decided(envelopes, published=False)
        if stored is not None:
            await self.outbox.publish_decision(d.job_id, failed, stored)

    async def _inherited(self, job: str, failed: int, chosen: domain.Candidate) -> domain.Candidate:
        """``chosen`` with the identity its writer declared, as the plan weighed it."""
        if not domain.lacks_identity(chosen):
            return chosen
        starts = []
        for n in range(failed, max(0, failed - INHERIT_WINDOW), -1):
            started = await self.state.started(job, n)
            if started is not None:
                starts.append(started)
        return domain.with_inherited_identity(chosen, job, starts)
