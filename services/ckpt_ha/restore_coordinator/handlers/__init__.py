"""Restore-coordinator handlers: fetch through the ports, ask the domain, persist, publish.

Every write to the coordinator's state and pins goes through `projection` (from the event
handled, or the decision about to be published), so a rebuild from the stream reproduces it.

One handler per unit of work, each with the few collaborators it needs (`app` wires them):

* `reports.Reports`: what running attempts report (started, heartbeats, progress, succeeded)
  and ``resume.loaded``; a continuity verdict a report decides is published.
* `failures.Failures`: ``job.failed`` and ``resume.load_failed`` (with `failures.Quarantine`).
* `burst.Burst`: a round of a fetched batch of ``job.failed``, each Redis step one round trip
  (or one script call) for all of its failures, the decisions published together.
* `operator.OperatorActs`: hold, unhold, a chosen rollback.
* `reshape.Replans`: a resumed attempt's ``job.started``: its plan re-stated for it when it
  runs on another shape than the failed attempt (`domain.replan`).
* `closing.Closings`: pins released by a newer checkpoint, a verified resume closed.
* `decide.Decider`: the decision of one failed attempt, shared by failures and operator acts.
* `outbox.Outbox`: what they publish, on the coordinator's clock.

`CoordinatorHandlers` routes each consumer (`app.CONSUMERS`) to the handler of its event.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointRegisteredV1
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
from ckpt_ha.contracts.resume import ResumeLoadedV1, ResumeLoadFailedV2, ResumeVerifiedV1
from ckpt_ha.restore_coordinator.handlers.closing import Closings
from ckpt_ha.restore_coordinator.handlers.failures import Failures
from ckpt_ha.restore_coordinator.handlers.operator import OperatorActs
from ckpt_ha.restore_coordinator.handlers.reports import Reports
from ckpt_ha.restore_coordinator.handlers.reshape import Replans
from ckpt_ha.restore_coordinator.projection import RestoreProjection


@dataclass(frozen=True)
class CoordinatorHandlers:
    """The consumers' entry points, by the method names `app.CONSUMERS` gives."""

    reports: Reports
    failures: Failures
    operator: OperatorActs
    closings: Closings
    replans: Replans

    @property
    def projection(self) -> RestoreProjection:
        """The one writer of the coordinator's state (the lost-attempt loop writes through it
        too)."""
        return self.reports.projection

    async def on_started(self, event: Envelope[JobStartedV1]) -> None:
        await self.reports.on_started(event)
        await self.replans.on_started(event)

    async def on_heartbeat(self, event: Envelope[JobHeartbeatV1]) -> None:
        await self.reports.on_heartbeat(event)

    async def on_progress(self, event: Envelope[JobProgressV1]) -> None:
        await self.reports.on_progress(event)

    async def on_succeeded(self, event: Envelope[JobSucceededV1]) -> None:
        await self.reports.on_succeeded(event)

    async def on_loaded(self, event: Envelope[ResumeLoadedV1]) -> None:
        await self.reports.on_loaded(event)

    async def on_failed(self, event: Envelope[JobFailedV1]) -> None:
        await self.failures.on_failed(event)

    async def on_load_failed(self, event: Envelope[ResumeLoadFailedV2]) -> None:
        await self.failures.on_load_failed(event)

    async def on_held(self, event: Envelope[JobHeldV1]) -> None:
        await self.operator.on_held(event)

    async def on_unheld(self, event: Envelope[JobUnheldV1]) -> None:
        await self.operator.on_unheld(event)

    async def on_restore_requested(self, event: Envelope[JobRestoreRequestedV1]) -> None:
        await self.operator.on_restore_requested(event)

    async def on_registered(self, event: Envelope[CheckpointRegisteredV1]) -> None:
        await self.closings.on_registered(event)

    async def on_verified(self, event: Envelope[ResumeVerifiedV1]) -> None:
        await self.closings.on_verified(event)

    async def on_failed_batch(self, batch: list[Envelope[EventData]]) -> list[BaseException | None]:
        return await self.failures.on_failed_batch(batch)

    async def on_heartbeats(self, batch: list[Envelope[EventData]]) -> list[BaseException | None]:
        return await self.reports.on_heartbeats(batch)

    async def on_progress_batch(
        self, batch: list[Envelope[EventData]]
    ) -> list[BaseException | None]:
        return await self.reports.on_progress_batch(batch)
