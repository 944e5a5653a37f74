"""Resume reports: what every running attempt says of itself (``job.started``,
``job.heartbeat``, ``job.progress``, ``job.succeeded``) and ``resume.loaded``. Each is a sign of
life noted on this coordinator's clock, recorded through the projection; a progress report of a
resumed attempt may decide its continuity verdict, published here."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.job import JobHeartbeatV1, JobProgressV1, JobStartedV1, JobSucceededV1
from ckpt_ha.contracts.resume import ResumeLoadedV1
from ckpt_ha.restore_coordinator import domain, liveness
from ckpt_ha.restore_coordinator.handlers.outbox import Outbox
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.ports import RestoreState
from ckpt_ha.restore_coordinator.projection import Progress, RestoreProjection

log = logging.getLogger("ckpt_ha.restore_coordinator")


class Reports:
    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        outbox: Outbox,
        metrics: RestoreMetrics,
    ) -> None:
        self.state = state
        self.projection = projection
        self.outbox = outbox
        self.metrics = metrics

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
        key = liveness.attempt_key(d.job_id, d.run_id, d.attempt)
        await self.state.heard(key, self.outbox.clock())

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
        now = self.outbox.clock()
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
        await self.outbox.publish(outcome.verdict, "verdict")
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
