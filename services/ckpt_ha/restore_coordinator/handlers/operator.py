"""Operator acts: ``job.held`` / ``job.unheld`` / ``job.restore_requested`` (``ckpt-ha job
...``). A hold pauses automatic restores (failures are recorded, not decided); an unhold or a
chosen rollback decides the job's latest attempt through the `Decider`."""

from __future__ import annotations

import logging
from datetime import datetime

from ckpt_ha.contracts import Envelope
from ckpt_ha.contracts.job import JobHeldV1, JobRestoreRequestedV1, JobUnheldV1
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.handlers.decide import HISTORY_WINDOW, Decider
from ckpt_ha.restore_coordinator.ports import CheckpointReads, RestoreState
from ckpt_ha.restore_coordinator.projection import RestoreProjection

log = logging.getLogger("ckpt_ha.restore_coordinator")


class OperatorActs:
    def __init__(
        self,
        state: RestoreState,
        projection: RestoreProjection,
        registry: CheckpointReads,
        decider: Decider,
    ) -> None:
        self.state = state
        self.projection = projection
        self.registry = registry
        self.decider = decider

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
        await self.decider.decide(
            job,
            attempt,
            started,
            await self.state.history(job, attempt, HISTORY_WINDOW),
            excluded,
            last=last,
            failed_at=at or asked_at or self.decider.outbox.clock(),
            failed_step=last.step if last is not None else None,
        )
