"""Restore-coordinator handlers: fetch through the ports, ask the domain, persist, publish.

Every write to the coordinator's state and pins goes through `projection` (from the event
handled, or the decision about to be published), so a rebuild from the stream reproduces it."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import cast

from ckpt_ha.contracts import CATALOG, Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointRegisteredV1
from ckpt_ha.contracts.job import (
    JobFailedV1,
    JobHeartbeatV1,
    JobHeldV1,
    JobProgressV1,
    JobRestoreRequestedV1,
    JobStartedV1,
    JobSucceededV1,
    JobUnheldV1,
)
from ckpt_ha.contracts.resume import (
    LoadBlame,
    ResumeLoadedV1,
    ResumeLoadFailedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.core.errors import DependencyNotReady, TransientError
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import adapters, domain, liveness
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.ports import (
    CheckpointReads,
    Clock,
    NewId,
    ObjectStore,
    PinStore,
    Publisher,
    RestoreState,
    StoredEvents,
)
from ckpt_ha.restore_coordinator.projection import Progress, RestoreProjection
from ckpt_ha.restore_coordinator.records import DecisionRecord, History, Point, Started
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.telemetry import tracing

SOURCE = "ckpt-ha/restore-coordinator"
HISTORY_WINDOW = 64
"""Failures read back per decision (the same-failure stop condition looks at the latest ones)."""
INHERIT_WINDOW = 16
"""Attempts looked back at for the one that wrote a checkpoint without its own identity."""
log = logging.getLogger("ckpt_ha.restore_coordinator")


class DecisionInProgress(TransientError):
    """Another replica (or delivery) holds the lease on this failure: retry, then find its
    decision."""

    code = "decision_in_progress"

    def __init__(self, job_id: str, attempt: int) -> None:
        self.job_id = job_id
        self.attempt = attempt
        super().__init__(f"failure of {job_id} attempt {attempt} is being decided elsewhere")


def _new_id() -> str:
    return uuid.uuid4().hex


class CoordinatorHandlers:
    def __init__(
        self,
        state: RestoreState,
        pins: PinStore,
        registry: CheckpointReads,
        store: ObjectStore,
        bus: Publisher,
        clock: Clock,
        metrics: RestoreMetrics,
        *,
        new_id: NewId = _new_id,
        lease_ttl_s: float = 30.0,
        load_failed_grace_s: float = 3.0,
        verification_grace_s: float = 40.0,
        stored: StoredEvents | None = None,
    ) -> None:
        self.state = state
        self.pins = pins
        self.registry = registry
        self.store = store
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.new_id = new_id
        self.lease_ttl_s = lease_ttl_s
        self.load_failed_grace_s = load_failed_grace_s
        self.verification_grace_s = verification_grace_s
        self.stored = stored
        """The stream's newest commit of a failed job (`_unregistered_commit`); None: not read."""
        self.projection = RestoreProjection(state, pins, registry)

    # --- job.started / job.progress ---

    async def on_started(self, event: Envelope[JobStartedV1]) -> None:
        await self.projection.started(event)
        await self._heard(event.data)
        self.metrics.job_started(event.data.job_id)

    async def on_heartbeat(self, event: Envelope[JobHeartbeatV1]) -> None:
        """A sign of life of the attempt: its heartbeat deadline starts again (`liveness`)."""
        await self.projection.heartbeat(event)
        await self._heard(event.data)

    async def _heard(self, d: JobStartedV1 | JobHeartbeatV1 | JobProgressV1) -> None:
        """Noted on this coordinator's clock (`liveness.lost`: a reporter's clock that is
        behind never makes a living attempt lost)."""
        await self.state.heard(liveness.attempt_key(d.job_id, d.run_id, d.attempt), self.clock())

    async def on_heartbeats(self, batch: list[Envelope[EventData]]) -> list[BaseException | None]:
        """`on_heartbeat` of a fetched batch: every watch moved and every attempt heard in a
        few round trips for the whole batch (what the coordinator gets most of)."""
        events = cast(Sequence[Envelope[JobHeartbeatV1]], batch)  # the consumer's filter
        await self.projection.heartbeats(events)
        await self._heard_all([e.data for e in events])
        return [None] * len(events)

    async def on_progress_batch(
        self, batch: list[Envelope[EventData]]
    ) -> list[BaseException | None]:
        """`on_progress` of a fetched batch: attempts heard and reports recorded for the whole
        batch at once (`RestoreProjection.progress_many`), then each report's own outcome
        (metrics, a verdict to publish), settled on its own."""
        events = cast(Sequence[Envelope[JobProgressV1]], batch)  # the consumer's filter
        await self._heard_all([e.data for e in events])
        outcomes = await self.projection.progress_many(events)
        results: list[BaseException | None] = []
        for event, outcome in zip(events, outcomes, strict=True):
            try:
                await self._progressed(event, outcome)
            except Exception as exc:  # noqa: BLE001 - this report's own outcome
                results.append(exc)
            else:
                results.append(None)
        return results

    async def _heard_all(self, ds: Sequence[JobHeartbeatV1 | JobProgressV1]) -> None:
        now = self.clock()
        await self.state.heard_many(
            {liveness.attempt_key(d.job_id, d.run_id, d.attempt): now for d in ds}
        )

    async def on_progress(self, event: Envelope[JobProgressV1]) -> None:
        await self._heard(event.data)
        await self._progressed(event, await self.projection.progress(event))

    async def _progressed(self, event: Envelope[JobProgressV1], outcome: Progress) -> None:
        """What a recorded report leads to: metrics, and the verdict it decided, published."""
        d = event.data
        if outcome.stale:
            self.metrics.stale_progress.labels(self.metrics.service).inc()
            log.info("%s: progress of stale attempt %s ignored (fenced)", d.job_id, d.attempt)
            return
        self.metrics.last_progress.set_max(d.job_id, value=event.time.timestamp())
        if outcome.verdict is None or outcome.plan is None or outcome.result is None:
            return
        plan, verdict = outcome.plan, outcome.result.verdict
        await self.bus.publish(self._envelope(outcome.verdict, "verdict"))
        self.metrics.verdicts.labels(self.metrics.service, verdict).inc()
        self.metrics.outcome(
            d.job_id,
            verdict,
            at=event.time.timestamp(),
            seconds=(event.time - plan.failed_at).total_seconds(),
        )

    async def on_succeeded(self, event: Envelope[JobSucceededV1]) -> None:
        """The run is over: its start records may expire like the rest of its state."""
        await self.projection.succeeded(event)

    # --- job.failed / resume.load_failed ---

    async def on_failed(self, event: Envelope[JobFailedV1]) -> None:
        d = event.data
        if domain.ends_the_run(d):
            await self.projection.cancelled(event)
            log.info("%s attempt %d was cancelled by a user: no restore", d.job_id, d.attempt)
            return
        started, last, history, excluded, decision = await self.projection.failed(
            event, HISTORY_WINDOW
        )
        if decision is not None:
            await self._publish_decision(d.job_id, d.attempt, decision)
            return
        if started is None:
            raise DependencyNotReady(f"job.failed of {d.job_id} attempt {d.attempt}", "job.started")
        if await self.state.held(d.job_id):
            log.info("%s attempt %d failed while held: recorded, not planned", d.job_id, d.attempt)
            return  # `on_unheld` decides it, if it is still the latest failure then
        if domain.awaits_load_failure(d.plan_id, last) and await self._decided_elsewhere(d):
            return  # a restore that failed to load: its resume.load_failed planned the fallback
        await self._decide(
            d.job_id,
            d.attempt,
            started,
            history,
            excluded,
            last=last,
            failed_at=event.time,
            failed_step=d.last_step,
        )

    async def _decided_elsewhere(self, d: JobFailedV1) -> bool:
        """A resumed attempt failed before any progress: most likely its load failed, and the
        ``resume.load_failed`` (published before the process exited) is being handled by the
        other consumer. Give it a moment to decide, so it is the fallback that gets planned."""
        deadline = time.monotonic() + self.load_failed_grace_s
        while time.monotonic() < deadline:
            decision = await self.state.decision(d.job_id, d.attempt)
            if decision is not None:
                await self._publish_decision(d.job_id, d.attempt, decision)
                return True
            await asyncio.sleep(0.05)
        return False

    async def on_loaded(self, event: Envelope[ResumeLoadedV1]) -> None:
        """Resume metrics only: failure → the resumed job loaded its checkpoint."""
        d = event.data
        plan = domain.own_plan(await self.state.plan(d.plan_id), d.job_id)
        if plan is None:
            return
        self.metrics.outcome(
            d.job_id,
            "loaded",
            at=event.time.timestamp(),
            seconds=(event.time - plan.failed_at).total_seconds(),
        )

    async def on_load_failed(self, event: Envelope[ResumeLoadFailedV2]) -> None:
        """R7: a failure that blames the checkpoint excludes and quarantines it and plans the
        one before; one that blames the attempt leaves the checkpoint valid: storage trouble is
        decided again (the storage stop condition counts it), anything else escalates.

        Only for the job's own checkpoint and plan: a load failure naming another job's is
        refused (`JobMismatch`) before anything is excluded, quarantined or planned."""
        d = event.data
        found = await self.projection.load_failed(event)
        record, plan, outcome, excluded = found.record, found.plan, found.outcome, found.excluded
        self.metrics.outcome(d.job_id, "load_failed", at=event.time.timestamp())
        await self._quarantine(event, record)
        if plan is None:
            log.warning("load failure for unknown plan %s: nothing planned", d.plan_id)
            return
        decision = await self.state.decision(d.job_id, plan.attempt)
        if decision is not None:
            await self._publish_decision(d.job_id, plan.attempt, decision)
            return
        started = domain.resumed_start(
            await self.state.started(d.job_id, plan.attempt),
            await self.state.started(d.job_id, plan.failed_attempt),
            plan,
        )
        if started is None:
            raise DependencyNotReady(f"load failure of plan {d.plan_id}", "job.started")
        escalate = outcome is domain.LoadOutcome.ESCALATE
        await self._decide(
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

    async def _quarantine(
        self, event: Envelope[ResumeLoadFailedV2], record: CheckpointRecord | None
    ) -> None:
        """R7: a checkpoint whose bytes failed to load is quarantined (bytes moved aside first)."""
        d = event.data
        if d.blame is not LoadBlame.CHECKPOINT:
            return
        found = adapters.candidate(record) if record is not None else None
        quarantined = domain.quarantine_after_load_failure(d.job_id, found, d.reason, d.blame)
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
                await self.bus.publish_caused_by(event, datas, source=SOURCE, time=self.clock())

    async def _decide(
        self,
        job: str,
        attempt: int,
        started: Started,
        history: History,
        excluded: set[str],
        *,
        last: Point | None,
        failed_at: datetime,
        failed_step: int | None,
        fallback: domain.Fallback | None = None,
        stop: domain.Escalation | None = None,
    ) -> None:
        """One decision per failed attempt (a plan or an escalation), stored, then published.
        The lease keeps a duplicate delivery or a second replica from deciding at the same
        time; the stored decision makes every later delivery re-publish the same events."""
        if not await self.state.lease(job, attempt, self.new_id(), self.lease_ttl_s):
            raise DecisionInProgress(job, attempt)
        try:
            stored = await self.state.decision(job, attempt)
            if stored is None:
                stored = await self._decide_now(
                    job, attempt, started, history, excluded, last, failed_at, failed_step,
                    fallback, stop,
                )  # fmt: skip
            await self._publish_decision(job, attempt, stored)
        finally:
            await self.state.release(job, attempt)

    async def _starts(self, job: str, attempt: int, chosen: domain.Candidate) -> list[Started]:
        """The job's recent ``job.started`` records, read only when the chosen checkpoint lacks
        identity the compatibility check needs (one read per attempt, newest first)."""
        if not domain.lacks_identity(chosen):
            return []
        found = []
        for n in range(attempt, max(0, attempt - INHERIT_WINDOW), -1):
            started = await self.state.started(job, n)
            if started is not None:
                found.append(started)
        return found

    async def _unregistered_commit(self, job: str, failed_at: datetime) -> str | None:
        """The job's newest commit in the stream, when the failure waits for the registry to
        record it (`domain.awaits_commit`) and it has not yet; None: nothing to wait for. Past
        the grace nothing is read."""
        if self.stored is None or not domain.within_grace(
            failed_at, self.clock(), self.verification_grace_s
        ):
            return None
        newest = await self.stored.last_event(CheckpointCommittedV1.EVENT_TYPE, job)
        if newest is None or not isinstance(newest.data, CheckpointCommittedV1):
            return None
        if not domain.awaits_commit(newest.time, failed_at):
            return None
        checkpoint_id = newest.data.checkpoint_id
        if await self.registry.get(checkpoint_id) is not None:
            return None
        return checkpoint_id

    async def _decide_now(
        self,
        job: str,
        attempt: int,
        started: Started,
        history: History,
        excluded: set[str],
        last: Point | None,
        failed_at: datetime,
        failed_step: int | None,
        fallback: domain.Fallback | None,
        stop: domain.Escalation | None = None,
    ) -> DecisionRecord:
        with tracing.span("registry.select", attributes={"db.system": "redis"}):
            selection = await adapters.selection(self.registry, job, excluded)
        fresh = fallback is None and stop is None
        if fresh and domain.stop_reason(history, started.policy, failed_at) is None:
            awaited = domain.verification_to_await(
                selection, failed_at, self.clock(), self.verification_grace_s
            )
            if awaited is not None:  # nak'ed and decided again after the bus's backoff
                raise DependencyNotReady(
                    f"job.failed of {job} attempt {attempt}",
                    f"the verification of {awaited.checkpoint_id} (step {awaited.step})",
                    in_stream=False,  # its own deadline: the grace
                )
            unheard = await self._unregistered_commit(job, failed_at)
            if unheard is not None:
                raise DependencyNotReady(
                    f"job.failed of {job} attempt {attempt}",
                    f"the registrar to register its commit {unheard}",
                    in_stream=False,  # the same grace
                )
        if selection.chosen is not None:
            starts = await self._starts(job, attempt, selection.chosen)
            inherited = domain.with_inherited_identity(selection.chosen, job, starts)
            selection = replace(selection, chosen=inherited)
        chosen = selection.chosen
        at_step = None
        if chosen is not None and chosen.step is not None:
            at_step = await self.state.point_at(job, chosen.step)
        decision = domain.decide_failure(
            job=job,
            attempt=attempt,
            started=started,
            history=history,
            selection=selection,
            excluded=excluded,
            last=last,
            at_chosen_step=at_step,
            failed_at=failed_at,
            failed_step=failed_step,
            fallback=fallback,
            stop=stop,
        )
        self._trace(job, attempt, decision)
        now = self.clock()
        if fallback is None:
            self.metrics.job_failed(job)
        outcome, detail = decision.outcome
        if decision.escalation is not None:
            self.metrics.outcome(job, outcome, at=now.timestamp(), reason=detail)
        else:
            since_failure = (now - failed_at).total_seconds()
            self.metrics.outcome(job, outcome, at=now.timestamp(), seconds=since_failure)
        envelopes = [self._envelope(x, "decision") for x in decision.events]
        stored = await self.projection.decided(envelopes, published=False)
        if stored is None:  # never: a failure decision is a plan, or an escalation naming it
            raise RuntimeError(f"decision about {job} attempt {attempt} holds no decision event")
        self.metrics.decisions.labels(self.metrics.service, outcome, detail).inc()
        return stored

    @staticmethod
    def _trace(job: str, attempt: int, decision: domain.FailureDecision) -> None:
        chosen, verdict, stop = decision.chosen, decision.verdict, decision.escalation
        if chosen is None or verdict is None:
            if stop is not None and stop.reason is domain.Stop.NO_VALID_CHECKPOINT:
                tracing.annotate(**{"ckpt_ha.decision": "escalate", "ckpt_ha.reason": stop.detail})
            return
        # Choosing a checkpoint to restore is part of its story: a span in its trace (from the
        # registry, however long ago it was written), linked to this failure's handling.
        with tracing.continue_trace(
            "restore.select",
            chosen.traceparent,
            tracestate=chosen.tracestate,
            attributes={
                "ckpt_ha.job_id": job,
                "ckpt_ha.checkpoint_id": chosen.checkpoint_id,
                "ckpt_ha.plan_id": decision.plan_id,
                "ckpt_ha.attempt": attempt + 1,
            },
        ):
            tracing.annotate(
                **{
                    "ckpt_ha.mode": verdict.mode.value if verdict.mode else None,
                    "ckpt_ha.compatibility": verdict.compatibility.value,
                }
            )

    async def _publish_decision(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        if decision.published:
            return
        for raw in decision.events:
            await self.bus.publish(CATALOG.decode(raw.encode()))
        await self.state.mark_published(job, attempt, decision)

    def _envelope(self, data: EventData, key: str) -> Envelope[EventData]:
        """In the current trace from the start: a decision is stored as it is published (and
        republished as is after a crash), so the stream holds what the state holds."""
        current = tracing.current_traceparent()
        traceparent, tracestate = current if current is not None else (None, None)
        return build(
            data,
            source=SOURCE,
            time=self.clock(),
            key=key,
            traceparent=traceparent,
            tracestate=tracestate,
        )

    # --- operator acts: job.held / job.unheld / job.restore_requested (`ckpt-ha job ...`) ---

    async def on_held(self, event: Envelope[JobHeldV1]) -> None:
        """Automatic restores of the job pause: its failures are recorded, not decided."""
        await self.projection.hold(event)
        log.info("%s held by %s: %s", event.data.job_id, event.data.actor, event.data.reason)

    async def on_unheld(self, event: Envelope[JobUnheldV1]) -> None:
        """Automatic restores resume; the latest failure is decided now if nothing decided it
        while the job was held (an older held failure is not: only the latest attempt is
        restored)."""
        await self.projection.hold(event)
        await self._decide_latest(event.data.job_id, chosen=None)

    async def on_restore_requested(self, event: Envelope[JobRestoreRequestedV1]) -> None:
        """A chosen rollback, from a valid checkpoint of the job's own: the latest attempt is
        decided now with a plan from it. A failed attempt not decided yet (the job is held, or
        its plan is awaited) is planned; a running one too: its runner hears the plan for the
        next attempt, ends the running one and relaunches from the plan. Every newer checkpoint
        is left out of this one decision only (not quarantined, not excluded later)."""
        d = event.data
        record = await self.registry.get(d.checkpoint_id)
        refused = domain.refuse_rollback(
            d.job_id,
            d.checkpoint_id,
            record.job_id if record is not None else None,
            record.state if record is not None else None,
        )
        if refused is not None or record is None:
            log.warning("%s: rollback asked by %s refused: %s", d.job_id, d.actor, refused)
            return
        await self._decide_latest(d.job_id, chosen=record, asked_at=event.time)

    async def _latest_attempt(self, job: str) -> tuple[int, datetime | None]:
        """The job's latest started attempt and when it failed (None: it has not)."""
        failures = await self.state.failures(job)
        attempt = failures[-1].attempt if failures else 0
        while await self.state.started(job, attempt + 1) is not None:
            attempt += 1
        failed_at = next((f.at for f in failures if f.attempt == attempt), None)
        return attempt, failed_at

    async def _decide_latest(
        self, job: str, chosen: CheckpointRecord | None, asked_at: datetime | None = None
    ) -> None:
        """Decide the job's latest attempt: a failed one (unhold, rollback), or a running one
        (rollback only: ``asked_at`` stands for its failure time)."""
        attempt, at = await self._latest_attempt(job)
        if at is None and (chosen is None or asked_at is None):
            return  # nothing failed: nothing to decide
        started = await self.state.started(job, attempt)
        if started is None:
            return
        if await self.state.decision(job, attempt) is not None:
            log.info("%s attempt %d: already decided (see `ckpt-ha job show`)", job, attempt)
            return
        excluded = await self.state.excluded(job)
        if chosen is not None:
            newer = [
                r.checkpoint_id
                for r in await self.registry.by_job(job)
                if r.step is None or chosen.step is None or r.step > chosen.step
            ]
            excluded = excluded | set(newer)
        last = await self.state.last(job, attempt)
        await self._decide(
            job,
            attempt,
            started,
            await self.state.history(job, attempt, HISTORY_WINDOW),
            excluded,
            last=last,
            failed_at=at or asked_at or self.clock(),
            failed_step=last.step if last is not None else None,
        )

    # --- checkpoint.registered (R15) and resume.verified (R11) ---

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
                at=self.clock().timestamp(),
                reason=closure.escalation.reason.value,
            )
        await self.bus.publish_caused_by(
            event, list(closure.events), source=SOURCE, time=self.clock()
        )
