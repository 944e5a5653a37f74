"""Restore-coordinator handlers: read the job's state, ask the domain, persist, publish."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import CATALOG, Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointQuarantinedV1,
    CheckpointRegisteredV1,
    CheckpointState,
    FailureSide,
)
from ckpt_ha.contracts.job import JobFailedV1, JobProgressV1, JobStartedV1
from ckpt_ha.contracts.resume import (
    ResumeClosedV1,
    ResumeDivergedV1,
    ResumeEscalatedV1,
    ResumeLoadedV1,
    ResumeLoadFailedV1,
    ResumePlannedV1,
    ResumeVerifiedV1,
)
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.errors import DependencyNotReady, TransientError
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.adapters import (
    CoordinatorState,
    Decision,
    PlanRecord,
    RegistryReader,
    Started,
)
from ckpt_ha.storage import ObjectStore, StorageError, key_for_uri
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import RestoreMetrics

SOURCE = "ckpt-ha/restore-coordinator"
HISTORY_WINDOW = 64
"""Failures read back per decision (the same-failure stop condition looks at the latest ones)."""
log = logging.getLogger("ckpt_ha.restore_coordinator")


class DecisionInProgress(TransientError):
    """Another replica (or delivery) holds the lease on this failure: retry, then find its
    decision."""

    code = "decision_in_progress"

    def __init__(self, job_id: str, attempt: int) -> None:
        self.job_id = job_id
        self.attempt = attempt
        super().__init__(f"failure of {job_id} attempt {attempt} is being decided elsewhere")


def delete_folder(store: ObjectStore, key: str) -> int:
    """Every object under ``key/``; returns how many were deleted (blocking I/O)."""
    keys = [info.key for info in store.list(key.rstrip("/") + "/")]
    for k in keys:
        store.delete(k)
    return len(keys)


class CoordinatorHandlers:
    def __init__(
        self,
        state: CoordinatorState,
        registry: RegistryReader,
        store: ObjectStore,
        bus: Bus,
        clock: Clock,
        metrics: RestoreMetrics,
        *,
        lease_ttl_s: float = 30.0,
        load_failed_grace_s: float = 3.0,
    ) -> None:
        self.state = state
        self.registry = registry
        self.store = store
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.lease_ttl_s = lease_ttl_s
        self.load_failed_grace_s = load_failed_grace_s

    # --- job.started / job.progress ---

    async def on_started(self, event: Envelope[JobStartedV1]) -> None:
        await self.state.record_started(event.data.job_id, Started.of(event.data, event.time))
        self.metrics.job_started(event.data.job_id)

    async def on_progress(self, event: Envelope[JobProgressV1]) -> None:
        d = event.data
        point = domain.Point(
            step=d.step,
            at=event.time,
            attempt=d.attempt,
            data_position=d.data_position,
            rng_fingerprint=d.rng_fingerprint,
            metrics=d.metrics,
        )
        self.metrics.last_progress.set_max(d.job_id, value=event.time.timestamp())
        plan = await self.state.plan(d.plan_id) if d.plan_id else None
        if plan is None or await self.state.verdict(plan.plan_id) is not None:
            await self.state.record_progress(d.job_id, [point], last=point)
            return
        # A resumed attempt before its verdict: compare, do not overwrite the old trajectory.
        keep = 4 * plan.policy.continuity_steps + 16
        observed = await self.state.observe(plan.plan_id, point, keep)
        trajectory = await self.state.trajectory(d.job_id, [p.step for p in observed])
        result = domain.continuity(
            restored_step=plan.step, trajectory=trajectory, observed=observed, policy=plan.policy
        )
        if result.verdict == domain.PENDING:
            await self.state.record_progress(d.job_id, [], last=point)
            return
        if await self.state.set_verdict(plan.plan_id, result.verdict):
            await self.bus.publish(self._envelope(self._verdict(plan, d.run_id, result), "verdict"))
            self.metrics.verdicts.labels(self.metrics.service, result.verdict).inc()
            self.metrics.outcome(
                d.job_id,
                result.verdict,
                at=event.time.timestamp(),
                seconds=(event.time - plan.failed_at).total_seconds(),
            )
        await self.state.record_progress(d.job_id, observed, last=point)

    @staticmethod
    def _verdict(plan: PlanRecord, run_id: str, result: domain.Continuity) -> EventData:
        common: dict[str, object] = {
            "job_id": plan.job_id,
            "plan_id": plan.plan_id,
            "run_id": run_id,
            "checkpoint_id": plan.checkpoint_id,
            "step": result.step,
            "comparisons": result.comparisons,
        }
        if result.verdict == domain.VERIFIED:
            return ResumeVerifiedV1.model_validate(common)
        return ResumeDivergedV1.model_validate({**common, "reason": result.reason})

    # --- job.failed / resume.load_failed ---

    async def on_failed(self, event: Envelope[JobFailedV1]) -> None:
        d = event.data
        infrastructure = d.side is FailureSide.INFRASTRUCTURE
        failure = domain.Failure(d.attempt, event.time, d.signature, infrastructure)
        started, last, history, excluded, decision = await self.state.failure_context(
            d.job_id,
            d.attempt,
            failure,
            f"failed:{d.attempt}" if infrastructure else None,
            HISTORY_WINDOW,
        )
        if decision is not None:
            await self._publish_decision(d.job_id, d.attempt, decision)
            return
        if started is None:
            raise DependencyNotReady(f"job.failed of {d.job_id} attempt {d.attempt}", "job.started")
        if d.plan_id is not None and last is None and await self._decided_elsewhere(d):
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
        plan = await self.state.plan(d.plan_id)
        if plan is None:
            return
        self.metrics.outcome(
            d.job_id,
            "loaded",
            at=event.time.timestamp(),
            seconds=(event.time - plan.failed_at).total_seconds(),
        )

    async def on_load_failed(self, event: Envelope[ResumeLoadFailedV1]) -> None:
        d = event.data
        excluded = await self.state.exclude(d.job_id, d.checkpoint_id)
        self.metrics.outcome(d.job_id, "load_failed", at=event.time.timestamp())
        if d.side is FailureSide.INFRASTRUCTURE:
            await self.state.record_storage_error(d.job_id, f"load:{d.plan_id}", event.time)
        with tracing.span("registry.get", attributes={"db.system": "redis"}):
            record = await self.registry.get(d.checkpoint_id)
        if record is not None and record.state in (CheckpointState.VALID, CheckpointState.CORRUPT):
            quarantined = CheckpointQuarantinedV1(
                job_id=d.job_id,
                checkpoint_id=d.checkpoint_id,
                uri=record.uri,
                reason=f"load failed: {d.reason}"[:2000],
            )
            # A transition of the checkpoint: in its own trace, linked to this load failure.
            with tracing.continue_trace(
                "restore.load_failed",
                record.traceparent,
                tracestate=record.tracestate,
                attributes=tracing.event_attributes(event),
            ):
                tracing.fail(quarantined.reason, code="load_failed")
                datas = await isolate(self.store, [quarantined])
                await self.bus.publish_caused_by(event, datas, source=SOURCE, time=self.clock())
        plan = await self.state.plan(d.plan_id)
        if plan is None:
            log.warning("load failure for unknown plan %s: quarantined only", d.plan_id)
            return
        decision = await self.state.decision(d.job_id, plan.attempt)
        if decision is not None:
            await self._publish_decision(d.job_id, plan.attempt, decision)
            return
        started = await self.state.started(d.job_id, plan.attempt)
        if started is None:
            before = await self.state.started(d.job_id, plan.failed_attempt)
            if before is None:
                raise DependencyNotReady(f"load failure of plan {d.plan_id}", "job.started")
            started = before.model_copy(update={"attempt": plan.attempt})
        history = await self.state.history(d.job_id, plan.attempt, HISTORY_WINDOW)
        history = domain.History(
            restarts=history.restarts,
            failures=history.failures,
            storage_errors=history.storage_errors,
            fallbacks=plan.fallbacks,
        )
        last = await self.state.last(d.job_id, plan.failed_attempt)
        await self._decide(
            d.job_id,
            plan.attempt,
            started,
            history,
            excluded,
            last=last,
            failed_at=plan.failed_at,
            failed_step=None,
            fallback_from=d.checkpoint_id,
            fallbacks=plan.fallbacks + 1,
        )

    async def _decide(
        self,
        job: str,
        attempt: int,
        started: Started,
        history: domain.History,
        excluded: set[str],
        *,
        last: domain.Point | None,
        failed_at: datetime,
        failed_step: int | None,
        fallback_from: str | None = None,
        fallbacks: int = 0,
    ) -> None:
        """One decision per failed attempt (a plan or an escalation), stored, then published.
        The lease keeps a duplicate delivery or a second replica from deciding at the same
        time; the stored decision makes every later delivery re-publish the same events."""
        if not await self.state.lease(job, attempt, uuid.uuid4().hex, self.lease_ttl_s):
            raise DecisionInProgress(job, attempt)
        try:
            decision = await self.state.decision(job, attempt)
            if decision is None:
                pid = domain.plan_id(job, started.run_id, attempt)
                stop = domain.stop_reason(
                    history, started.policy, failed_at, load_failed=fallback_from is not None
                )
                plan: PlanRecord | None = None
                pins: list[domain.Pin] = []
                planned: ResumePlannedV1 | None = None
                if stop is None:
                    stop, plan, pins, planned = await self._plan(
                        job, attempt, pid, started, excluded, last, failed_at, failed_step,
                        fallbacks,
                    )  # fmt: skip
                datas: list[EventData] = []
                now = self.clock()
                since_failure = (now - failed_at).total_seconds()
                if fallback_from is None:
                    self.metrics.job_failed(job)
                if stop is not None:
                    datas.append(self._escalated(job, pid, stop))
                    outcome = ("escalated", stop.reason.value)
                    self.metrics.outcome(
                        job, "escalated", at=now.timestamp(), reason=stop.reason.value
                    )
                elif planned is not None:
                    datas.append(planned.model_copy(update={"fallback_from": fallback_from}))
                    outcome = ("planned", planned.mode.value)
                    self.metrics.outcome(job, "planned", at=now.timestamp(), seconds=since_failure)
                decision = Decision(
                    events=tuple(self._envelope(x, "decision").model_dump_json() for x in datas)
                )
                await self.state.record_decision(
                    job, attempt, decision, plan=plan, pins=pins, planned_at=failed_at
                )
                self.metrics.decisions.labels(self.metrics.service, *outcome).inc()
            await self._publish_decision(job, attempt, decision)
        finally:
            await self.state.release(job, attempt)

    async def _plan(
        self,
        job: str,
        attempt: int,
        pid: str,
        started: Started,
        excluded: set[str],
        last: domain.Point | None,
        failed_at: datetime,
        failed_step: int | None,
        fallbacks: int,
    ) -> tuple[
        domain.Escalation | None, PlanRecord | None, list[domain.Pin], ResumePlannedV1 | None
    ]:
        """The newest restorable checkpoint and how (R14), or why there is none."""
        with tracing.span("registry.select", attributes={"db.system": "redis"}):
            selection = await self.registry.select(job, excluded)
        chosen = selection.chosen
        if chosen is None or chosen.step is None:
            detail = "no valid checkpoint left to restore"
            if excluded:
                detail += f" (excluded after load failures: {', '.join(sorted(excluded))})"
            tracing.annotate(**{"ckpt_ha.decision": "escalate", "ckpt_ha.reason": detail})
            return domain.Escalation(domain.Stop.NO_VALID_CHECKPOINT, detail), None, [], None
        # Choosing a checkpoint to restore is part of its story: a span in its trace (from the
        # registry, however long ago it was written), linked to this failure's handling.
        with tracing.continue_trace(
            "restore.select",
            chosen.traceparent,
            tracestate=chosen.tracestate,
            attributes={
                "ckpt_ha.job_id": job,
                "ckpt_ha.checkpoint_id": chosen.checkpoint_id,
                "ckpt_ha.plan_id": pid,
                "ckpt_ha.attempt": attempt + 1,
            },
        ):
            verdict = domain.compatibility(
                chosen.identity,
                started.target(),
                started.policy,
                training_state=chosen.exact_resume is not False,
            )
            tracing.annotate(
                **{
                    "ckpt_ha.mode": verdict.mode.value if verdict.mode else None,
                    "ckpt_ha.compatibility": verdict.compatibility.value,
                }
            )
        if verdict.mode is None:
            detail = (
                f"compatibility {verdict.compatibility.value} restoring {chosen.checkpoint_id}: "
                + "; ".join(verdict.reasons)
            )
            return domain.Escalation(domain.Stop.COMPATIBILITY_UNKNOWN, detail), None, [], None
        at_step = await self.state.point_at(job, chosen.step)
        steps, seconds = domain.recompute(
            checkpoint_step=chosen.step,
            checkpoint_at=at_step.at if at_step is not None else chosen.created_at,
            last_progress=last,
            failed_step=failed_step,
            failed_at=failed_at,
        )
        pins = domain.pins_for(pid, attempt + 1, selection)
        planned = ResumePlannedV1(
            job_id=job,
            plan_id=pid,
            failed_run_id=started.run_id,
            attempt=attempt + 1,
            checkpoint_id=chosen.checkpoint_id,
            checkpoint_uri=chosen.uri,
            step=chosen.step,
            mode=verdict.mode,
            compatibility=verdict.compatibility,
            recompute_steps=steps,
            recompute_seconds=seconds,
            checkpoint_format=chosen.format,
            reasons=verdict.reasons,
            pinned=tuple(p.checkpoint_id for p in pins),
            expected_step=chosen.step,
        )
        plan = PlanRecord(
            plan_id=pid,
            job_id=job,
            failed_run_id=started.run_id,
            failed_attempt=attempt,
            attempt=attempt + 1,
            checkpoint_id=chosen.checkpoint_id,
            step=chosen.step,
            fallbacks=fallbacks,
            failed_at=failed_at,
            policy=started.policy,
        )
        return None, plan, pins, planned

    async def _publish_decision(self, job: str, attempt: int, decision: Decision) -> None:
        if decision.published:
            return
        for raw in decision.events:
            await self.bus.publish(CATALOG.decode(raw.encode()))
        await self.state.mark_published(job, attempt, decision)

    @staticmethod
    def _escalated(job: str, plan_id: str, stop: domain.Escalation) -> ResumeEscalatedV1:
        return ResumeEscalatedV1(
            job_id=job,
            plan_id=plan_id,
            reason=stop.reason,
            next_step=stop.next_step,
            detail=stop.detail[:4000],
        )

    def _envelope(self, data: EventData, key: str) -> Envelope[EventData]:
        return build(data, source=SOURCE, time=self.clock(), key=key)

    # --- checkpoint.registered (R15) and resume.verified (R11) ---

    async def on_registered(self, event: Envelope[CheckpointRegisteredV1]) -> None:
        d = event.data
        if d.state is not CheckpointState.VALID:
            return
        pins = await self.state.pins(d.job_id)
        if not pins:
            return
        ids = domain.to_unpin(
            pins,
            registered_step=d.step,
            registered_attempt=d.identity.attempt if d.identity is not None else None,
        )
        await self.state.unpin(d.job_id, ids)
        if ids:
            log.info("%s: unpinned %s after %s registered", d.job_id, ids, d.checkpoint_id)

    async def on_verified(self, event: Envelope[ResumeVerifiedV1]) -> None:
        d = event.data
        plan = await self.state.plan(d.plan_id)
        if plan is None:
            log.warning("resume.verified for unknown plan %s: nothing to close", d.plan_id)
            return
        records = await self.registry.by_job(d.job_id)
        left = domain.leftovers(
            records,
            run_id=plan.failed_run_id,
            attempt=plan.failed_attempt,
            failed_at=plan.failed_at,
        )
        cleaned, unreclaimable = await self._reclaim([c.uri for c in left])
        for outcome, items in (("cleaned", cleaned), ("unreclaimable", unreclaimable)):
            self.metrics.reclaimed.labels(self.metrics.service, outcome).inc(len(items))
        await self.state.release(d.job_id, plan.failed_attempt)
        datas: list[EventData] = [
            ResumeClosedV1(
                job_id=d.job_id,
                plan_id=d.plan_id,
                cleaned=tuple(cleaned),
                unreclaimable=tuple(unreclaimable),
            )
        ]
        if unreclaimable:
            stop = domain.Escalation(domain.Stop.UNRECLAIMABLE, "; ".join(unreclaimable))
            datas.append(self._escalated(d.job_id, d.plan_id, stop))
            self.metrics.outcome(
                d.job_id, "escalated", at=self.clock().timestamp(), reason=stop.reason.value
            )
        await self.bus.publish_caused_by(event, datas, source=SOURCE, time=self.clock())

    async def _reclaim(self, uris: Sequence[str]) -> tuple[list[str], list[str]]:
        cleaned: list[str] = []
        unreclaimable: list[str] = []
        for uri in uris:
            key = key_for_uri(self.store, uri)
            if key is None:
                unreclaimable.append(f"{uri}: outside this coordinator's storage root")
                continue
            try:
                await asyncio.to_thread(delete_folder, self.store, key)
            except StorageError as exc:
                if exc.transient:
                    raise
                unreclaimable.append(f"{uri}: {exc}")
                continue
            cleaned.append(uri)
        return cleaned, unreclaimable
