"""One round of a burst of failures (`Failures.on_failed_batch`): at most one failure per job,
taken through the steps of `Failures.on_failed` and `Decider.decide` together.

Each step's Redis reads or writes are one round trip for the whole round, not one per failure:
record the failures and read their contexts, which jobs are held, take the leases and read the
decisions stored meanwhile (one script), every job's newest checkpoints (`adapters.
selections`, each record parsed only if the selection reads it), the trajectory points at the
chosen steps, then store every decision with its plan, restart and
pins in one transaction (`RestoreProjection.decided_many`), publish them all at once and awaited
together, mark them published and give the leases back. What only some failures need (a
verification or a commit awaited, identity inherited, a missing primary, a job whose newest
page holds no earlier valid checkpoint, an escalation) is read for those alone, as before.

Every plan is still decided and stored once: a failure is decided only under its lease, and
only when no decision is stored for it after the lease was taken; a stored decision is
published again as stored. Each failure keeps its own result (a failure not ready yet is
nak'ed alone) and its own span, in which its decision's events are built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.job import JobFailedV1
from ckpt_ha.restore_coordinator import adapters, domain
from ckpt_ha.restore_coordinator.handlers.decide import (
    HISTORY_WINDOW,
    DecisionInProgress,
    Failed,
    lease_waiting,
)
from ckpt_ha.restore_coordinator.records import DecisionRecord
from ckpt_ha.telemetry import tracing

if TYPE_CHECKING:
    from ckpt_ha.restore_coordinator.handlers.failures import Failures

Result = BaseException | None
Decided = tuple[int, DecisionRecord, Sequence[Envelope[EventData]] | None]
"""A failure's index in the round, its stored decision, and its events when built here."""


def scope(event: Envelope[JobFailedV1]) -> tracing.Scope:
    """The failure's own span (as a consumer's span would be), opened at its first step and
    entered again at each later one (not opened anew: one span per failure, its trace
    context parsed once): what is decided for it is built, and its errors noted, in there."""
    return tracing.Scope(
        f"restore-coordinator {event.event_type}",
        event.traceparent,
        tracestate=event.tracestate,
        attributes=tracing.event_attributes(event) if tracing.recording() else None,
        link_origin=False,
    )


def noted(exc: Exception) -> Exception:
    """A failure's own error, annotated on its span (call inside its `scope`)."""
    tracing.annotate(**{"ckpt_ha.error": repr(exc)[:500]})
    return exc


class Burst:
    """One round (`run`): its failures' results, in their order."""

    def __init__(self, failures: Failures) -> None:
        self.failures = failures
        self.decider = failures.decider
        self.state = failures.state
        self.scopes: dict[int, tracing.Scope] = {}
        """Each failure's span, by its index in the round (`scope`)."""

    async def run(self, events: Sequence[Envelope[JobFailedV1]]) -> list[Result]:
        results: list[Result] = [None] * len(events)
        ready: list[int] = []
        for i, event in enumerate(events):
            if domain.ends_the_run(event.data):  # a user's cancel: one at a time, as ever
                results[i] = await self._alone(event)
            else:
                ready.append(i)
        if not ready:
            return results
        self.scopes = {i: scope(events[i]) for i in ready}
        try:
            await self._round(events, ready, results)
        finally:
            for opened in self.scopes.values():
                opened.end()
        return results

    async def _round(
        self,
        events: Sequence[Envelope[JobFailedV1]],
        ready: list[int],
        results: list[Result],
    ) -> None:
        chosen = [events[i] for i in ready]
        contexts = await self.failures.projection.failed_many(chosen, HISTORY_WINDOW)
        undecided = [e.data.job_id for e, c in zip(chosen, contexts, strict=True) if c[4] is None]
        held = await self.state.held_of(undecided)
        todo: list[tuple[int, Failed]] = []
        again: list[Decided] = []
        for i, context in zip(ready, contexts, strict=True):
            event = events[i]
            with self.scopes[i].entered():
                try:
                    found = await self.failures.assess(event, context, event.data.job_id in held)
                except Exception as exc:  # noqa: BLE001 - this failure's own result
                    results[i] = noted(exc)
                    continue
            if isinstance(found, DecisionRecord):
                again.append((i, found, None))
            elif found is not None:
                todo.append((i, found))
        await self._decide(events, todo, again, results)

    async def _alone(self, event: Envelope[JobFailedV1]) -> Result:
        alone = scope(event)
        try:
            with alone.entered():
                try:
                    await self.failures.on_failed(event)
                except Exception as exc:  # noqa: BLE001 - this failure's own result
                    return noted(exc)
            return None
        finally:
            alone.end()

    async def _decide(
        self,
        events: Sequence[Envelope[JobFailedV1]],
        todo: list[tuple[int, Failed]],
        again: list[Decided],
        results: list[Result],
    ) -> None:
        """Under the leases: decide what is not decided yet, then publish it all."""
        rules = self.decider.rules
        taken = await lease_waiting(self.state, [f.key for _, f in todo], rules.new_id(), rules)
        leased: list[tuple[int, Failed]] = []
        fresh: list[tuple[int, Failed]] = []
        for (i, f), (ok, stored) in zip(todo, taken, strict=True):
            if not ok:
                results[i] = DecisionInProgress(f.job, f.attempt)
                continue
            leased.append((i, f))
            if stored is None:  # read under the lease: nobody decided it meanwhile
                fresh.append((i, f))
            else:
                again.append((i, stored, None))
        try:
            decided = await self._decide_fresh(events, fresh, results)
            await self._publish(events, [*again, *decided], results)
        finally:
            await self.state.release_many([f.key for _, f in leased])

    async def _decide_fresh(
        self,
        events: Sequence[Envelope[JobFailedV1]],
        fresh: list[tuple[int, Failed]],
        results: list[Result],
    ) -> list[Decided]:
        decider = self.decider
        with tracing.span("registry.select", attributes={"db.system": "redis"}):
            selections = await adapters.selections(
                decider.sources.registry, [(f.job, f.excluded) for _, f in fresh]
            )
        refined: list[tuple[int, Failed, domain.Selection]] = []
        for (i, f), selection in zip(fresh, selections, strict=True):
            with self.scopes[i].entered():
                try:
                    refined.append((i, f, await decider.refine(f, selection)))
                except Exception as exc:  # noqa: BLE001 - this failure's own result
                    results[i] = noted(exc)
        wanted = [
            (f.job, s.chosen.step)
            for _, f, s in refined
            if s.chosen is not None and s.chosen.step is not None
        ]
        points = iter(await self.state.points_at(wanted))
        concluded = []
        for i, f, s in refined:
            at_step = next(points) if s.chosen is not None and s.chosen.step is not None else None
            with self.scopes[i].entered():
                try:
                    concluded.append((i, decider.conclude(f, s, at_step)))
                except Exception as exc:  # noqa: BLE001 - this failure's own result
                    results[i] = noted(exc)
        stored = await decider.projection.decided_many([c.events for _, c in concluded])
        out: list[Decided] = []
        for (i, c), record in zip(concluded, stored, strict=True):
            if record is None:  # never: a failure decision is a plan, or an escalation naming it
                results[i] = RuntimeError(f"decision about failure {i} holds no decision event")
                continue
            decider.stored(c)
            out.append((i, record, c.events))
        return out

    async def _publish(
        self,
        events: Sequence[Envelope[JobFailedV1]],
        decisions: list[Decided],
        results: list[Result],
    ) -> None:
        """Every decision not published yet, all at once (each one's events in order), then
        marked published together."""
        outbox = self.decider.outbox
        pending = [(i, record, built) for i, record, built in decisions if not record.published]
        sent = await outbox.send_many([(record, built) for _, record, built in pending])
        done = []
        for (i, record, _), outcome in zip(pending, sent, strict=True):
            if outcome is not None:
                results[i] = outcome
            else:
                done.append((events[i].data.job_id, events[i].data.attempt, record))
        await self.state.mark_published_many(done)
