"""The lost-attempt loop: declares ``job.failed`` cause ``lost`` for silent attempts.

Runs on one replica at a time (the loop lease, `ckpt_ha.runtime.leader`). Each round it reads
the watched attempts past their deadline (`RestoreState.overdue`, kept by the projection from
job.started / job.progress / job.heartbeat) and publishes, for each, a ``job.failed`` v2 with
cause ``lost``, side infrastructure and ``reported_by`` ``restore-coordinator``, keyed
``lost|<job>|<run>|<attempt>`` (`liveness.event_key`): two replicas, or a replica before and
after a restart, publish the same event id, which the stream keeps once; the watch ends with it
(through the projection, as when the event comes back on the ``failed`` consumer). That
consumer then decides the failure like any other: a plan, which the resuming runner waits for
(``ckpt-ha run --resume``), or an escalation. The event is signed with the job's key like every
job event (the service holds the master key), so admission accepts it.

Silence is only evidence when the coordinator has heard everything there was to hear:

* no round declares anything while the coordinator's own job-event consumers have a backlog
  (a restarted coordinator first catches up on the heartbeats published while it was down);
* an attempt is declared only after the loop has watched without interruption for at least
  that attempt's deadline (`liveness.lost`): after a restart, a lease handover, or a round that
  could not read the consumers (the bus was away, and the heartbeats with it), the clock starts
  again;
* the deadline runs on the events' own times (what a rebuild sees too), but an attempt a
  replica heard from within its deadline on the coordinator's own clock (`RestoreState.heard`)
  is alive, whatever its host's clock says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from ckpt_ha.contracts import build
from ckpt_ha.restore_coordinator import liveness
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.restore_coordinator.ports import Clock, Publisher, RestoreState
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.records import Watch
from ckpt_ha.runtime.leader import next_round
from ckpt_ha.telemetry import logs

log = logging.getLogger("ckpt_ha.restore_coordinator.watchdog")
SOURCE = "ckpt-ha/restore-coordinator"
ROUND_LIMIT = 100
"""Attempts declared per round at most (the next round takes the rest)."""

Backlog = Callable[[], Awaitable[bool]]
"""True while a consumer of job events has messages not yet handled."""


class LostAttempts:
    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        bus: Publisher,
        clock: Clock,
        metrics: RestoreMetrics,
        backlog: Backlog,
    ) -> None:
        self.state = state
        self.projection = projection
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.backlog = backlog
        self.watching_since: datetime | None = None
        """Since when this loop has watched without interruption (None: not now)."""

    async def round(self) -> list[Watch]:
        """One check; returns the attempts declared lost. Raises what the bus or Redis raised
        (the watching clock is reset first)."""
        now = self.clock()
        try:
            if await self.backlog():
                if self.watching_since is None:
                    self.watching_since = now
                return []
            if self.watching_since is None:
                self.watching_since = now
            watching_s = (now - self.watching_since).total_seconds()
            overdue = await self.state.overdue(now, ROUND_LIMIT)
            keys = [w.key for w in overdue]
            heard = await self.state.last_heard(keys)
            declared = [
                w for w, k in zip(overdue, keys, strict=True)
                if liveness.lost(w, now, watching_s, heard.get(k))
            ]  # fmt: skip
            for watch in declared:
                await self._declare(watch, now)
        except BaseException:
            self.watching_since = None
            raise
        return declared

    async def _declare(self, watch: Watch, now: datetime) -> None:
        event = build(
            liveness.lost_event(watch, now),
            source=SOURCE,
            time=now,
            key=liveness.event_key(watch),
        )
        await self.bus.publish(event)
        await self.projection.ended(event)
        self.metrics.lost.labels(self.metrics.service).inc()
        self.metrics.outcome(watch.job_id, "lost", at=now.timestamp())
        log.warning(
            "%s run %s attempt %d lost: silent since %s (deadline %s s)",
            watch.job_id, watch.run_id, watch.attempt, watch.seen.isoformat(), watch.deadline_s,
            extra=logs.about(job_id=watch.job_id),
        )  # fmt: skip

    async def run(self, interval_s: float) -> None:
        """Forever, every ``interval_s`` (under the loop lease)."""
        self.watching_since = None  # a new holder of the lease watches afresh
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("lost-attempt round failed: %r", exc)
            await next_round(interval_s)
