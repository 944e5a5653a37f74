"""Failure planning: ``job.failed`` and ``resume.load_failed``, each recorded through the
projection and decided by the `Decider` (a load failure that blames the checkpoint quarantines
it first, `Quarantine`).

A burst of failures (a rack lost) arrives as fetched batches (`Failures.on_failed_batch`),
decided a round at a time (`burst.Burst`): the same steps as `Failures.on_failed`, each Redis
read and write one round trip for the whole round and the publishes awaited together, instead
of a dozen round trips and an acknowledged publish per failure. The leases and the stored
decisions keep every plan decided and stored once, whatever the batch or the replica."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.job import JobFailedV1
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV2
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import adapters, domain
from ckpt_ha.restore_coordinator.handlers.burst import Burst
from ckpt_ha.restore_coordinator.handlers.decide import HISTORY_WINDOW, Decider, Failed
from ckpt_ha.restore_coordinator.handlers.outbox import Outbox
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.ports import CheckpointReads, ObjectStore, RestoreState
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.records import DecisionRecord, FailureContext
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.telemetry import tracing

log = logging.getLogger("ckpt_ha.restore_coordinator")


class Quarantine:
    """R7: a checkpoint whose bytes failed to load is quarantined (bytes moved aside first)."""

    def __init__(self, store: ObjectStore, registry: CheckpointReads, outbox: Outbox) -> None:
        self.store = store
        self.registry = registry
        self.outbox = outbox

    async def after_load_failure(
        self,
        event: Envelope[ResumeLoadFailedV2],
        record: CheckpointRecord | None,
        loaded_from: str | None = None,
    ) -> None:
        d = event.data
        if d.blame is not LoadBlame.CHECKPOINT:
            return
        found = adapters.candidate(record) if record is not None else None
        quarantined = domain.quarantine_after_load_failure(
            d.job_id, found, d.reason, d.blame, loaded_from
        )
        if quarantined is not None and found is not None:
            # A transition of the checkpoint: in its own trace, linked to this load failure.
            with tracing.continue_trace(
                "restore.load_failed",
                found.traceparent,
                tracestate=found.tracestate,
                attributes=tracing.event_attributes(event),
            ):
                tracing.fail(quarantined.reason, code="load_failed")
                datas = await isolate(self.store, [quarantined], self.registry)
                await self.outbox.publish_caused_by(event, datas)


class Failures:
    """``job.failed`` and ``resume.load_failed``: record, then decide (or re-publish the
    decision already stored for that failure)."""

    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        decider: Decider,
        quarantine: Quarantine,
        metrics: RestoreMetrics,
        *,
        load_failed_grace_s: float = 3.0,
    ) -> None:
        self.state = state
        self.projection = projection
        self.decider = decider
        self.quarantine = quarantine
        self.metrics = metrics
        self.load_failed_grace_s = load_failed_grace_s

    async def on_failed(self, event: Envelope[JobFailedV1]) -> None:
        d = event.data
        if domain.ends_the_run(d):
            await self.projection.cancelled(event)
            log.info("%s attempt %d was cancelled by a user: no restore", d.job_id, d.attempt)
            return
        context = await self.projection.failed(event, HISTORY_WINDOW)
        held = await self.state.held(d.job_id) if context[4] is None else False
        found = await self.assess(event, context, held)
        if isinstance(found, DecisionRecord):
            await self.decider.outbox.publish_decision(d.job_id, d.attempt, found)
        elif found is not None:
            await self.decider.decide(
                found.job,
                found.attempt,
                found.started,
                found.history,
                found.excluded,
                last=found.last,
                failed_at=found.failed_at,
                failed_step=found.failed_step,
            )

    async def assess(
        self, event: Envelope[JobFailedV1], context: FailureContext, held: bool
    ) -> Failed | DecisionRecord | None:
        """What a recorded failure calls for: the decision already stored for it (published
        again), nothing (held: `on_unheld` decides it, if it is still the latest failure then),
        or a decision (`Failed`). Raises `DependencyNotReady` while it must wait."""
        d = event.data
        started, last, history, excluded, decision = context
        if decision is not None:
            return decision
        if started is None:
            raise DependencyNotReady(f"job.failed of {d.job_id} attempt {d.attempt}", "job.started")
        if held:
            log.info("%s attempt %d failed while held: recorded, not planned", d.job_id, d.attempt)
            return None
        if domain.awaits_load_failure(d.plan_id, last) and domain.within_grace(
            event.time, self.decider.outbox.clock(), self.load_failed_grace_s
        ):
            # A resumed attempt failed before any progress: most likely its load failed, and
            # the ``resume.load_failed`` (published before the process exited) is being handled
            # by the other consumer. Not ready yet, as a failure awaiting a verification: nak'ed
            # and handled again after the bus's back-off, when that decision is found above.
            raise DependencyNotReady(
                f"job.failed of {d.job_id} attempt {d.attempt}",
                f"the decision of its plan {d.plan_id}'s load failure",
                in_stream=False,  # its own deadline: the load-failure grace
            )
        if domain.awaits_load_failure(d.plan_id, last) and await self._load_failure_deciding(
            d.plan_id, excluded
        ):
            # Past the grace, but the other consumer has already excluded the plan's checkpoint
            # for its load failure and is deciding it (a loaded coordinator can take longer
            # than the grace): deciding here would plan the one before without its fallback.
            raise DependencyNotReady(
                f"job.failed of {d.job_id} attempt {d.attempt}",
                f"the decision of its plan {d.plan_id}'s load failure",
            )
        return Failed(
            d.job_id, d.attempt, started, history, excluded, last, event.time, d.last_step
        )

    async def _load_failure_deciding(self, plan_id: str | None, excluded: set[str]) -> bool:
        """Whether the load failure of this plan's checkpoint was recorded (the location it
        loaded, or the whole checkpoint by an older coordinator, excluded) while its decision is
        not stored yet."""
        if plan_id is None:
            return False
        plan = await self.state.plan(plan_id)
        if plan is None:
            return False
        at = await self.projection.loaded_from(plan, plan.checkpoint_id)
        ruled_out = {plan.checkpoint_id, domain.load_failure_exclusion(plan.checkpoint_id, at)}
        return not ruled_out.isdisjoint(excluded)

    async def on_failed_batch(self, batch: list[Envelope[EventData]]) -> list[BaseException | None]:
        """`on_failed` of a fetched batch, with its result for each failure (a failure not
        ready yet is nak'ed alone, its neighbours settled). Taken in rounds, each job's
        failures in stream order: the first failure of every job, then the second of those
        with two, and so on. A round is one `Burst`: a few round trips for all of its
        failures' reads and writes, its publishes awaited together."""
        events = cast(Sequence[Envelope[JobFailedV1]], batch)  # the consumer's filter
        rounds: list[list[int]] = []
        seen: dict[str, int] = {}
        for i, event in enumerate(events):
            n = seen[event.data.job_id] = seen.get(event.data.job_id, -1) + 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append(i)
        results: list[BaseException | None] = [None] * len(events)
        for indices in rounds:
            got = await Burst(self).run([events[i] for i in indices])
            for i, result in zip(indices, got, strict=True):
                results[i] = result
        return results

    async def on_load_failed(self, event: Envelope[ResumeLoadFailedV2]) -> None:
        """R7: a failure that blames the checkpoint excludes the location it was loaded from and
        quarantines it (a primary's bytes; never for a load from a copy), then plans the same
        checkpoint from a verified copy not yet excluded, else the one before; one that blames
        the attempt leaves the checkpoint valid: storage trouble is decided again (the storage
        stop condition counts it), anything else escalates.

        Only for the job's own checkpoint and plan: a load failure naming another job's is
        refused (`JobMismatch`) before anything is excluded, quarantined or planned."""
        d = event.data
        found = await self.projection.load_failed(event)
        record, plan, outcome, excluded = found.record, found.plan, found.outcome, found.excluded
        self.metrics.outcome(d.job_id, "load_failed", at=event.time.timestamp())
        await self.quarantine.after_load_failure(event, record, found.loaded_from)
        if plan is None:
            log.warning("load failure for unknown plan %s: nothing planned", d.plan_id)
            return
        decision = await self.state.decision(d.job_id, plan.attempt)
        if decision is not None:
            await self.decider.outbox.publish_decision(d.job_id, plan.attempt, decision)
            return
        started = domain.resumed_start(
            await self.state.started(d.job_id, plan.attempt),
            await self.state.started(d.job_id, plan.failed_attempt),
            plan,
        )
        if started is None:
            raise DependencyNotReady(f"load failure of plan {d.plan_id}", "job.started")
        escalate = outcome is domain.LoadOutcome.ESCALATE
        await self.decider.decide(
            d.job_id,
            plan.attempt,
            started,
            await self.state.history(d.job_id, plan.attempt, HISTORY_WINDOW),
            excluded,
            last=await self.state.last(d.job_id, plan.failed_attempt),
            failed_at=plan.failed_at,
            failed_step=None,
            fallback=(
                domain.Fallback(d.checkpoint_id, plan.fallbacks)
                if outcome is domain.LoadOutcome.FALLBACK
                else None
            ),
            stop=domain.cannot_load(d.job_id, plan, d.reason) if escalate else None,
        )
