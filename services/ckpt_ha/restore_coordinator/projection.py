"""The restore-coordinator's memory as a projection of the event stream.

Every write the coordinator makes to its own state (`RestoreState`, ``<p>:coord:*``) and to the
R15 pins (`PinStore`, ``<p>:pins:<job>``) is made here, from one event. The live handlers call
these methods with the event they handle (for a decision: with the event they are about to
publish); ``ckpt-ha registry rebuild`` calls `RestoreProjection.apply` with every event of the
stream, in stream order. One projection, so what the coordinator remembers is what the stream
says, and a registry rebuilt after a flush remembers what the live one did.

============================  ==========================================================
event                         writes
============================  ==========================================================
job.started                   the attempt's start (policy, restore target); the job's
                              watch (`liveness`): its heartbeat deadline from now
job.progress                  trajectory and last point; for a resumed attempt before its
                              verdict: its observations, then the verdict; a sign of life.
                              Nothing for a stale attempt (a later attempt of its run is
                              planned: fenced)
job.heartbeat                 a sign of life of the watched attempt (nothing else)
job.failed                    the failure (one per attempt); an infrastructure-side one
                              also counts as a storage error; the watch ends. A cancelled
                              one (cause ``cancelled``) only ends the run, as job.succeeded
                              does
job.succeeded                 the run is over: its start records may expire; the watch ends
job.held / job.unheld         automatic restores of the job paused / resumed (``ckpt-ha job
                              hold``): a held job's failures are recorded, not decided
resume.load_failed            the location the plan loaded the checkpoint from excluded
                              (when the load blames it: its primary or one copy), a
                              storage error (when infrastructure-side)
resume.planned                the decision about the failed attempt, its plan, the restart,
                              the pins (all carried by the event)
resume.escalated              the decision (when it names the failed attempt); the run is
                              over for automatic restores
checkpoint.registered         the pins a newer valid checkpoint of the resumed attempt
                              releases
resume.verified / .diverged   the verdict (set before the event was published; replaying
                              the progress reports sets the same one)
(attention)                   the job's `Attention` record: set by an escalation, a lost
                              attempt, a diverged resume, a load failure; settled by a hold,
                              a start, the run's end, a verified resume, and (an escalation
                              only) a plan after it
============================  ==========================================================

Not here: leases (who decides a failure right now: transient), the note that a stored
decision's events were published (`RestoreState.mark_published`: a replay stores every decision
as published, having read it from the stream), and the side effects of the handlers
(publishing, quarantine moves, closure's deletions, metrics): a replay must not repeat them, and
their outcomes are events of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointRegisteredV1, FailureSide
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobHeartbeatV1,
    JobHeldV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    JobSucceededV1,
    JobUnheldV1,
)
from ckpt_ha.contracts.resume import (
    ResumeDivergedV1,
    ResumeEscalatedV2,
    ResumeLoadFailedV2,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import domain, liveness
from ckpt_ha.restore_coordinator.ports import CheckpointReads, PinStore, RestoreState
from ckpt_ha.restore_coordinator.progress_projection import Progress, ProgressProjection
from ckpt_ha.restore_coordinator.records import (
    DecisionRecord,
    DecisionWrite,
    FailureContext,
    FailureItem,
    PlanRecord,
    Started,
    planned_location,
    planned_pins,
)
from ckpt_ha.telemetry import tracing

__all__ = ["FailureContext", "LoadFailure", "Progress", "RestoreProjection"]


@dataclass(frozen=True)
class LoadFailure:
    """What a ``resume.load_failed`` found and recorded (the handler goes on to decide)."""

    record: CheckpointRecord | None
    plan: PlanRecord | None
    outcome: domain.LoadOutcome
    excluded: set[str] = field(default_factory=set)
    loaded_from: str | None = None
    """Where the plan loaded the checkpoint from (its primary or a copy; None: not known)."""


def _complete(data: ResumePlannedV2) -> bool:
    """Whether the plan states its failure time, fallback count and policy (an older
    coordinator's may not)."""
    return None not in (data.failed_at, data.fallbacks, data.policy)


def _failure_item(event: Envelope[JobFailedV1]) -> FailureItem:
    """What recording a failure writes: an infrastructure-side one counts as a storage error."""
    d = event.data
    infrastructure = d.side is FailureSide.INFRASTRUCTURE
    return (
        d.job_id,
        d.attempt,
        domain.Failure(d.attempt, event.time, d.signature, infrastructure),
        f"failed:{d.attempt}" if infrastructure else None,
    )


class RestoreProjection(ProgressProjection):
    """The coordinator's state writes, one event at a time (see the module doc)."""

    def __init__(self, state: RestoreState, pins: PinStore, registry: CheckpointReads) -> None:
        self.state = state
        self.pins = pins
        self.registry = registry

    async def apply(self, event: Envelope[EventData]) -> None:
        """Replay one event of the stream (a rebuild): the writes its live handler made.
        Raises what the live handler raised for it (e.g. `JobMismatch`: it was refused)."""
        data = event.data
        if isinstance(data, JobStartedV1):
            await self.started(cast(Envelope[JobStartedV1], event))
        elif isinstance(data, JobProgressV1):
            await self.progress(cast(Envelope[JobProgressV1], event))
        elif isinstance(data, JobHeartbeatV1):
            await self.heartbeat(cast(Envelope[JobHeartbeatV1], event))
        elif isinstance(data, JobFailedV1) and domain.ends_the_run(data):
            await self.cancelled(cast(Envelope[JobFailedV1], event))
        elif isinstance(data, JobFailedV1):
            await self.failed(cast(Envelope[JobFailedV1], event))
        elif isinstance(data, JobSucceededV1):
            await self.succeeded(cast(Envelope[JobSucceededV1], event))
        elif isinstance(data, ResumeLoadFailedV2):
            await self.load_failed(cast(Envelope[ResumeLoadFailedV2], event))
        elif isinstance(data, ResumePlannedV2 | ResumeEscalatedV2):
            await self.decided([event], published=True)
        elif isinstance(data, CheckpointRegisteredV1):
            await self.registered(cast(Envelope[CheckpointRegisteredV1], event))
        elif isinstance(data, ResumeVerifiedV1 | ResumeDivergedV1):
            await self.verdict(cast(Envelope[ResumeVerifiedV1 | ResumeDivergedV1], event))
        elif isinstance(data, JobHeldV1 | JobUnheldV1):
            await self.hold(cast(Envelope[JobHeldV1 | JobUnheldV1], event))

    # --- job.* ---

    async def hold(self, event: Envelope[JobHeldV1 | JobUnheldV1]) -> None:
        """``job.held`` pauses automatic restores of the job, ``job.unheld`` resumes them. A
        hold is someone taking the job in hand: what it needed is settled."""
        held = isinstance(event.data, JobHeldV1)
        await self.state.set_held(event.data.job_id, held)
        if held:
            await self.state.settle(event.data.job_id, event.time)

    async def started(self, event: Envelope[JobStartedV1]) -> None:
        d = event.data
        await self.state.record_started(d.job_id, Started.of(d, event.time))
        await self.state.update_watch(d.job_id, lambda w: liveness.on_start(w, d, event.time))
        await self.state.settle(d.job_id, event.time)  # a new attempt or run: someone acted

    async def heartbeat(self, event: Envelope[JobHeartbeatV1]) -> None:
        d = event.data
        await self.state.update_watch(
            d.job_id, lambda w: liveness.on_alive(w, d.run_id, d.attempt, event.time, d.last_step)
        )

    async def heartbeats(self, events: Sequence[Envelope[JobHeartbeatV1]]) -> None:
        """`heartbeat` of a fetched batch: each job's watch moves once for all of its reports
        (applied in stream order), every job's in one atomic step."""
        await self.state.update_watches(
            liveness.alive_changes(
                (e.data.job_id, e.data.run_id, e.data.attempt, e.time, e.data.last_step)
                for e in events
            )
        )

    async def ended(self, event: Envelope[JobFailedV1] | Envelope[JobSucceededV1]) -> None:
        """The attempt is over (failed, succeeded, or declared lost): no longer watched."""
        d = event.data
        await self.state.update_watch(
            d.job_id, lambda w: liveness.on_end(w, d.job_id, d.run_id, d.attempt, event.time)
        )

    async def failed(self, event: Envelope[JobFailedV1], same_window: int = 1) -> FailureContext:
        """Record the failure (idempotent: one per attempt) and read back, in the same round
        trip, what deciding it needs (the latest ``same_window`` failures of the history)."""
        d = event.data
        await self.ended(event)
        if d.cause == FailureCause.LOST.value:
            await self.state.attend(d.job_id, "lost", "", event.time)
        return await self.state.failure_context(*_failure_item(event), same_window)

    async def failed_many(
        self, events: Sequence[Envelope[JobFailedV1]], same_window: int = 1
    ) -> list[FailureContext]:
        """`failed` of a burst (none cancelled), in stream order: the watches end in one atomic
        step, the failures are recorded and their contexts read back in one round trip."""
        await self.state.update_watches(
            liveness.ended_changes(
                (e.data.job_id, e.data.run_id, e.data.attempt, e.time) for e in events
            )
        )
        for e in events:
            if e.data.cause == FailureCause.LOST.value:
                await self.state.attend(e.data.job_id, "lost", "", e.time)
        return await self.state.failure_contexts([_failure_item(e) for e in events], same_window)

    async def succeeded(self, event: Envelope[JobSucceededV1]) -> None:
        await self.ended(event)
        await self.state.end_run(event.data.job_id, event.data.attempt)
        await self.state.settle(event.data.job_id, event.time)

    async def cancelled(self, event: Envelope[JobFailedV1]) -> None:
        """A user cancelled the attempt: the run is over for automatic restores."""
        await self.ended(event)
        await self.state.end_run(event.data.job_id, event.data.attempt)
        await self.state.settle(event.data.job_id, event.time)

    # --- resume.* ---

    async def load_failed(self, event: Envelope[ResumeLoadFailedV2]) -> LoadFailure:
        """Only for the job's own checkpoint and plan: a load failure naming another job's is
        refused (`JobMismatch`) before anything is recorded. One that blames the checkpoint
        excludes, for good, the location the plan loaded it from (R7: its primary or one copy;
        the whole checkpoint for a plan that did not keep its location)."""
        d = event.data
        with tracing.span("registry.get", attributes={"db.system": "redis"}):
            record = await self.registry.get(d.checkpoint_id)
        plan = await self.state.plan(d.plan_id)
        refused = domain.foreign(
            d.job_id,
            d.checkpoint_id,
            event.event_type,
            record_job=record.job_id if record is not None else None,
            plan_job=plan.job_id if plan is not None else None,
        )
        if refused is not None:
            raise refused
        outcome = domain.after_load_failure(d.blame, d.side)
        loaded_from = await self.loaded_from(plan, d.checkpoint_id)
        if outcome is domain.LoadOutcome.FALLBACK:
            ruled_out = domain.load_failure_exclusion(d.checkpoint_id, loaded_from)
            excluded = await self.state.exclude(d.job_id, ruled_out)
        else:
            excluded = await self.state.excluded(d.job_id)
        if d.side is FailureSide.INFRASTRUCTURE:
            await self.state.record_storage_error(d.job_id, f"load:{d.plan_id}", event.time)
        await self.state.attend(d.job_id, "load_failed", "", event.time)
        return LoadFailure(record, plan, outcome, excluded, loaded_from)

    async def loaded_from(self, plan: PlanRecord | None, checkpoint_id: str) -> str | None:
        """Where ``plan`` loads ``checkpoint_id`` from: its stored ``resume.planned``'s
        ``checkpoint_uri`` (None: another checkpoint, or the plan's decision not found)."""
        if plan is None or plan.checkpoint_id != checkpoint_id:
            return None
        decision = await self.state.decision(plan.job_id, plan.failed_attempt)
        return planned_location(decision, plan.plan_id)

    async def decided(
        self, events: Sequence[Envelope[EventData]], *, published: bool
    ) -> DecisionRecord | None:
        """Store the decision about one failed attempt: ``events`` as published (a
        ``resume.planned`` or a ``resume.escalated`` naming the attempt), with the plan, the
        restart and the pins a plan implies, all taken from the event. An escalation ends the
        run. None: ``events`` hold no decision (an escalation of leftovers after a verified
        resume, or one of an older coordinator that did not name the attempt)."""
        decision = next(
            (e for e in events if isinstance(e.data, ResumePlannedV2 | ResumeEscalatedV2)), None
        )
        if decision is None:
            return None
        data = decision.data
        stored = DecisionRecord(
            events=tuple(e.model_dump_json() for e in events), published=published
        )
        if isinstance(data, ResumePlannedV2):
            # A plan after an escalation: someone asked for it (a rollback, an unhold).
            await self.state.settle(data.job_id, decision.time, only="escalated")
            plan = await self._plan_of(data, decision.time)
            await self.state.record_decision(
                data.job_id,
                plan.failed_attempt,
                stored,
                plan=plan,
                pins=planned_pins(data),
                planned_at=plan.failed_at,
            )
            return stored
        escalation = cast(ResumeEscalatedV2, data)
        await self.state.attend(escalation.job_id, "escalated", escalation.reason, decision.time)
        if escalation.attempt is None:
            return None
        await self.state.record_decision(escalation.job_id, escalation.attempt, stored)
        await self.state.end_run(escalation.job_id, escalation.attempt)
        return stored

    async def decided_many(
        self, decisions: Sequence[Sequence[Envelope[EventData]]]
    ) -> list[DecisionRecord | None]:
        """`decided` (not yet published) of a burst's decisions, one per failed attempt, in
        their order: the plans that state all they imply (this coordinator's) stored in one
        transaction, each with what it settles; anything else one at a time."""
        out: list[DecisionRecord | None] = []
        writes: list[DecisionWrite] = []
        for events in decisions:
            decision = next(
                (e for e in events if isinstance(e.data, ResumePlannedV2 | ResumeEscalatedV2)), None
            )
            data = decision.data if decision is not None else None
            if decision is None or not isinstance(data, ResumePlannedV2) or not _complete(data):
                out.append(await self.decided(events, published=False))
                continue
            stored = DecisionRecord(events=tuple(e.model_dump_json() for e in events))
            plan = PlanRecord.of(data)
            writes.append(
                DecisionWrite(
                    data.job_id,
                    plan.failed_attempt,
                    stored,
                    plan=plan,
                    pins=planned_pins(data),
                    planned_at=plan.failed_at,
                    settles=decision.time,
                )
            )
            out.append(stored)
        await self.state.record_decisions(writes)
        return out

    async def _plan_of(self, data: ResumePlannedV2, at: datetime) -> PlanRecord:
        """The plan record the event states. An event of an older coordinator lacks the failure
        time, the fallback count and the policy: they are recovered as that coordinator had
        them where the state allows (the failed attempt's start and failure, the plan it fell
        back from), else the plan's own time, 0 or 1, and the default policy."""
        if _complete(data):
            return PlanRecord.of(data)
        failed_attempt = data.attempt - 1
        started = await self.state.started(data.job_id, failed_attempt)
        policy = started.policy if started is not None else JobPolicy()
        if data.fallback_from is not None:
            earlier = domain.plan_id(data.job_id, data.failed_run_id, failed_attempt - 1)
            before = await self.state.plan(earlier)
            if before is not None and before.attempt == failed_attempt:
                return PlanRecord.of(
                    data, failed_at=before.failed_at, fallbacks=before.fallbacks + 1, policy=policy
                )
            return PlanRecord.of(data, failed_at=at, fallbacks=1, policy=policy)
        history = await self.state.history(data.job_id, failed_attempt, 1)
        failure = next((f for f in history.failures if f.attempt == failed_attempt), None)
        return PlanRecord.of(data, failed_at=failure.at if failure else at, policy=policy)

    async def verdict(self, event: Envelope[ResumeVerifiedV1 | ResumeDivergedV1]) -> None:
        """The plan's verdict as published (the first verdict of a plan wins)."""
        d = event.data
        if domain.own_plan(await self.state.plan(d.plan_id), d.job_id) is None:
            return
        verdict = domain.VERIFIED if isinstance(d, ResumeVerifiedV1) else domain.DIVERGED
        if await self.state.set_verdict(d.plan_id, verdict):
            await self._attend_verdict(d.job_id, verdict, event.time)

    async def _attend_verdict(self, job: str, verdict: str, at: datetime) -> None:
        """Diverged: someone must look. Verified: the job recovered, what it needed is over."""
        if verdict == domain.DIVERGED:
            await self.state.attend(job, "diverged", "", at)
        else:
            await self.state.settle(job, at)

    # --- checkpoint.registered (R15) ---

    async def registered(self, event: Envelope[CheckpointRegisteredV1]) -> list[str]:
        """Release the pins a newly registered valid checkpoint of the resumed attempt (newer
        than the restored step) makes unnecessary; returns the released ids."""
        d = event.data
        ids = domain.released_pins(
            await self.pins.pins(d.job_id),
            state=d.state,
            step=d.step,
            attempt=d.identity.attempt if d.identity is not None else None,
        )
        await self.pins.unpin(d.job_id, ids)
        return ids
