"""One unit of work: decide one failed attempt (a plan or an escalation), store the decision,
publish it. The lease keeps a duplicate delivery or a second replica from deciding at the same
time; the stored decision makes every later delivery re-publish the same events. A failure
that waits for a checkpoint on its way (a pending verification, a commit not registered yet)
is "not ready yet": `DependencyNotReady`, nak'ed and decided again after the bus's back-off."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1
from ckpt_ha.core.errors import DependencyNotReady, TransientError
from ckpt_ha.restore_coordinator import adapters, domain
from ckpt_ha.restore_coordinator.handlers.outbox import Outbox
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.ports import (
    CheckpointReads,
    NewId,
    ObjectStore,
    RestoreState,
    StoredEvents,
)
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.records import DecisionRecord, History, Point, Started
from ckpt_ha.telemetry import tracing

HISTORY_WINDOW = 64
"""Failures read back per decision (the same-failure stop condition looks at the latest ones)."""
MISSING_PRIMARIES = 4
"""Checkpoints passed over in one decision because their primary is gone and every copy of
them failed to load (each costs a storage listing)."""
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


def new_owner_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Sources:
    """What a decision reads besides the coordinator's own memory: the registry's records, and
    the stream's newest commit of the job (None: not read)."""

    registry: CheckpointReads
    stored: StoredEvents | None = None
    store: ObjectStore | None = None
    """The storage root: is the chosen checkpoint's primary still there, when it has a copy
    to restore from instead (None: not looked at)."""


@dataclass(frozen=True)
class DecisionRules:
    """How long a decider holds a failure and how long a fresh failure may wait."""

    lease_ttl_s: float = 30.0
    verification_grace_s: float = 40.0
    new_id: NewId = new_owner_id
    """The lease owner's id."""
    contended_wait_s: float = 1.0
    """How long a failure whose lease another holds waits for it (`lease_waiting`) before it
    is nak'ed as `DecisionInProgress`."""


CONTENDED_POLL_S = 0.05


async def lease_waiting(
    state: RestoreState, failures: Sequence[tuple[str, int]], owner: str, rules: DecisionRules
) -> list[tuple[bool, DecisionRecord | None]]:
    """`RestoreState.lease_many`, waiting up to ``rules.contended_wait_s`` for the leases
    another holds. A failure announced twice (the runner's ``job.failed`` and another's of the
    same attempt) is often decided on two replicas at once, both retried in step while they
    wait for the same checkpoint: the holder's decision takes milliseconds, after which this
    one takes the lease and finds it stored. A nak instead would spend a delivery, and on the
    last one dead-letter a failure that was being decided (seen in the two-replica drill)."""
    taken = await state.lease_many(failures, owner, rules.lease_ttl_s)
    deadline = time.monotonic() + rules.contended_wait_s
    while time.monotonic() < deadline:
        waiting = [i for i, (ok, _) in enumerate(taken) if not ok]
        if not waiting:
            break
        await asyncio.sleep(CONTENDED_POLL_S)
        again = await state.lease_many([failures[i] for i in waiting], owner, rules.lease_ttl_s)
        for i, result in zip(waiting, again, strict=True):
            taken[i] = result
    return taken


@dataclass(frozen=True)
class Failed:
    """One failed attempt to decide, with what its decision reads (`Decider.decide`)."""

    job: str
    attempt: int
    started: Started
    history: History
    excluded: set[str]
    last: Point | None
    failed_at: datetime
    failed_step: int | None
    fallback: domain.Fallback | None = None
    stop: domain.Escalation | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.job, self.attempt


@dataclass(frozen=True)
class Concluded:
    """A decision's events (stored, then published) and its outcome for the metrics."""

    events: list[Envelope[EventData]]
    outcome: str
    detail: str


class Decider:
    """Decides one failed attempt (`decide`); a burst's at once (`handlers.burst`) through the
    same steps: `refine` a selection, `conclude` it, store through the projection."""

    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        sources: Sources,
        outbox: Outbox,
        metrics: RestoreMetrics,
        rules: DecisionRules,
    ) -> None:
        self.state = state
        self.projection = projection
        self.sources = sources
        self.outbox = outbox
        self.metrics = metrics
        self.rules = rules

    async def decide(
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
        """One decision per failed attempt (a plan or an escalation), stored, then published."""
        [(taken, stored)] = await lease_waiting(
            self.state, [(job, attempt)], self.rules.new_id(), self.rules
        )
        if not taken:
            raise DecisionInProgress(job, attempt)
        failed = Failed(
            job, attempt, started, history, excluded, last, failed_at, failed_step, fallback, stop
        )
        try:
            if stored is None:  # read under the lease: nobody decided it meanwhile
                stored = await self._decide_now(failed)
            await self.outbox.publish_decision(job, attempt, stored)
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
        stored = self.sources.stored
        if stored is None or not domain.within_grace(
            failed_at, self.outbox.clock(), self.rules.verification_grace_s
        ):
            return None
        newest = await stored.last_event(CheckpointCommittedV1.EVENT_TYPE, job)
        if newest is None or not isinstance(newest.data, CheckpointCommittedV1):
            return None
        if not domain.awaits_commit(newest.time, failed_at):
            return None
        checkpoint_id = newest.data.checkpoint_id
        if await self.sources.registry.get(checkpoint_id) is not None:
            return None
        return checkpoint_id

    async def _at_a_live_location(
        self, job: str, selection: domain.Selection, excluded: set[str]
    ) -> domain.Selection:
        """The selection with a chosen checkpoint of a replicating tier (it has, or had,
        copies) whose primary is gone at decision time restored from its verified copy; when
        every copy of it has failed to load too, the checkpoint is passed over for this decision
        (the next one is chosen) rather than planned at a location that holds nothing. Only
        those checkpoints are looked at: one without copies is decided as before."""
        store = self.sources.store
        for _ in range(MISSING_PRIMARIES):
            chosen = selection.chosen
            if store is None or chosen is None or chosen.source is not None:
                return selection
            if not (chosen.copies or chosen.failed_at):
                return selection
            if await adapters.primary_present(store, job, chosen):
                return selection
            if chosen.copies:
                moved = domain.from_copy(chosen, "is missing (nothing left at its location)")
                return replace(selection, chosen=moved)
            excluded = excluded | {domain.exclusion(chosen.checkpoint_id, chosen.uri)}
            selection = await adapters.selection(self.sources.registry, job, excluded)
        return selection

    async def _decide_now(self, f: Failed) -> DecisionRecord:
        with tracing.span("registry.select", attributes={"db.system": "redis"}):
            selection = await adapters.selection(self.sources.registry, f.job, f.excluded)
        selection = await self.refine(f, selection)
        chosen = selection.chosen
        at_step = None
        if chosen is not None and chosen.step is not None:
            at_step = await self.state.point_at(f.job, chosen.step)
        concluded = self.conclude(f, selection, at_step)
        stored = await self.projection.decided(concluded.events, published=False)
        if stored is None:  # never: a failure decision is a plan, or an escalation naming it
            raise RuntimeError(
                f"decision about {f.job} attempt {f.attempt} holds no decision event"
            )
        self.stored(concluded)
        return stored

    async def refine(self, f: Failed, selection: domain.Selection) -> domain.Selection:
        """What is read besides the selection, only where it matters: a fresh failure waits
        (`DependencyNotReady`) for a verification or a commit on its way; the chosen
        checkpoint inherits the identity it lacks; a copy stands in for a primary gone."""
        fresh = f.fallback is None and f.stop is None
        if fresh and domain.stop_reason(f.history, f.started.policy, f.failed_at) is None:
            awaited = domain.verification_to_await(
                selection, f.failed_at, self.outbox.clock(), self.rules.verification_grace_s
            )
            if awaited is not None:  # nak'ed and decided again after the bus's backoff
                raise DependencyNotReady(
                    f"job.failed of {f.job} attempt {f.attempt}",
                    f"the verification of {awaited.checkpoint_id} (step {awaited.step})",
                    in_stream=False,  # its own deadline: the grace
                )
            unheard = await self._unregistered_commit(f.job, f.failed_at)
            if unheard is not None:
                raise DependencyNotReady(
                    f"job.failed of {f.job} attempt {f.attempt}",
                    f"the registrar to register its commit {unheard}",
                    in_stream=False,  # the same grace
                )
        selection = await self._at_a_live_location(f.job, selection, f.excluded)
        if selection.chosen is not None:
            starts = await self._starts(f.job, f.attempt, selection.chosen)
            inherited = domain.with_inherited_identity(selection.chosen, f.job, starts)
            selection = replace(selection, chosen=inherited)
        return selection

    def conclude(self, f: Failed, selection: domain.Selection, at_step: Point | None) -> Concluded:
        """The decision (pure), traced and measured: the events to store, then publish."""
        decision = domain.decide_failure(
            job=f.job,
            attempt=f.attempt,
            started=f.started,
            history=f.history,
            selection=selection,
            excluded=f.excluded,
            last=f.last,
            at_chosen_step=at_step,
            failed_at=f.failed_at,
            failed_step=f.failed_step,
            fallback=f.fallback,
            stop=f.stop,
        )
        _trace(f.job, f.attempt, decision)
        now = self.outbox.clock()
        if f.fallback is None:
            self.metrics.job_failed(f.job)
        outcome, detail = decision.outcome
        if decision.escalation is not None:
            self.metrics.outcome(f.job, outcome, at=now.timestamp(), reason=detail)
        else:
            since_failure = (now - f.failed_at).total_seconds()
            self.metrics.outcome(f.job, outcome, at=now.timestamp(), seconds=since_failure)
        return Concluded(
            [self.outbox.envelope(x, "decision") for x in decision.events], outcome, detail
        )

    def stored(self, concluded: Concluded) -> None:
        """A concluded decision was stored: counted."""
        self.metrics.decisions.labels(
            self.metrics.service, concluded.outcome, concluded.detail
        ).inc()


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
