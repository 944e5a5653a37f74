"""The restore-coordinator's projection of ``job.progress`` (see `projection`): trajectory and
last point, a sign of life, and for a resumed attempt before its verdict the continuity
comparison (R10). A part of `RestoreProjection`, kept apart by concern."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.job import JobProgressV1
from ckpt_ha.restore_coordinator import domain, liveness
from ckpt_ha.restore_coordinator.ports import RestoreState
from ckpt_ha.restore_coordinator.records import PlanRecord, Point


@dataclass(frozen=True)
class Progress:
    """What a progress report led to."""

    plan: PlanRecord | None = None
    """The plan whose continuity the report was compared for (None: recorded as trajectory)."""
    result: domain.Continuity | None = None
    verdict: EventData | None = None
    """``resume.verified`` / ``resume.diverged`` this report decided, to publish (None: none,
    or another delivery already set the plan's verdict)."""
    stale: bool = False
    """The report came from an attempt older than one already planned for its run (a fenced
    writer, R17): ignored."""


class ProgressProjection:
    """`RestoreProjection`'s progress writes (its state and verdict attention come from it)."""

    state: RestoreState

    async def _attend_verdict(self, job: str, verdict: str, at: datetime) -> None:
        raise NotImplementedError  # RestoreProjection's

    async def progress(self, event: Envelope[JobProgressV1]) -> Progress:
        """Record the report; a resumed attempt's reports before its verdict are compared with
        the pre-failure trajectory (R10) instead of overwriting it.

        Fencing (R17): a report of an attempt whose failure already has a plan (a later attempt
        of the run is planned: the plan id of a failure is fixed by job, run and attempt) comes
        from a stale writer, a zombie behind a partition, if it was sent after that failure
        (`domain.fenced`). It is ignored: it neither joins the trajectory nor feeds a continuity
        verdict. A report sent before the failure counts whenever it is read, so a rebuild,
        which reads reports and plans in time order, decides as the live coordinator did."""
        d = event.data
        fence = await self.state.plan(domain.plan_id(d.job_id, d.run_id, d.attempt))
        if domain.fenced(fence, event.time):
            return Progress(stale=True)
        point = Point(
            step=d.step,
            at=event.time,
            attempt=d.attempt,
            data_position=d.data_position,
            rng_fingerprint=d.rng_fingerprint,
            metrics=d.metrics,
        )
        await self.state.update_watch(
            d.job_id, lambda w: liveness.on_alive(w, d.run_id, d.attempt, event.time, d.step)
        )
        plan = domain.own_plan(await self.state.plan(d.plan_id), d.job_id) if d.plan_id else None
        verdict = await self.state.verdict(plan.plan_id) if plan is not None else None
        if plan is None or not domain.watches_continuity(plan, verdict):
            await self.state.record_progress(d.job_id, [point], last=point)
            return Progress()
        keep = 4 * plan.policy.continuity_steps + 16
        observed = await self.state.observe(plan.plan_id, point, keep)
        trajectory = await self.state.trajectory(d.job_id, [p.step for p in observed])
        result = domain.continuity(
            restored_step=plan.step, trajectory=trajectory, observed=observed, policy=plan.policy,
            world=await self._world(plan),
        )  # fmt: skip
        verdict_event = domain.verdict_event(plan, d.run_id, result)
        if verdict_event is None:
            await self.state.record_progress(d.job_id, [], last=point)
            return Progress(plan, result)
        first = await self.state.set_verdict(plan.plan_id, result.verdict)
        if first:
            await self._attend_verdict(d.job_id, result.verdict, event.time)
        # Decided: the observed reports join the trajectory.
        await self.state.record_progress(d.job_id, observed, last=point)
        return Progress(plan, result, verdict_event if first else None)

    async def _world(self, plan: PlanRecord) -> tuple[int, int] | None:
        """The failed attempt's and the resumed attempt's world sizes, when they differ (the
        trajectory was reported at the first, the resumed steps at the second)."""
        before = await self.state.started(plan.job_id, plan.failed_attempt)
        after = await self.state.started(plan.job_id, plan.attempt)
        if before is None or after is None:
            return None
        return domain.world_change(before.topology, after.topology)

    async def progress_many(self, events: Sequence[Envelope[JobProgressV1]]) -> list[Progress]:
        """`progress` of a fetched batch, in stream order, with the same outcome for each
        report. What a report needs is read for the whole batch at once (the plans that would
        fence it, the plans it names and their verdicts); the reports that only extend a
        trajectory (the common case: a running job, not a resumed one awaiting its verdict)
        are written together: their watches in one atomic step, their points in one round
        trip. A report compared for continuity goes through `progress` on its own, in its
        place (the reports before it written first), so it sees what they wrote."""
        fences = [domain.plan_id(e.data.job_id, e.data.run_id, e.data.attempt) for e in events]
        named = [e.data.plan_id for e in events if e.data.plan_id]
        plans = await self.state.plans_of([*fences, *named])
        owned = [
            domain.own_plan(plans.get(e.data.plan_id), e.data.job_id) if e.data.plan_id else None
            for e in events
        ]
        verdicts = await self.state.verdicts_of([p.plan_id for p in owned if p is not None])
        out: list[Progress] = []
        pending: list[Envelope[JobProgressV1]] = []
        for event, fence, plan in zip(events, fences, owned, strict=True):
            if domain.fenced(plans.get(fence), event.time):
                out.append(Progress(stale=True))
            elif plan is not None and domain.watches_continuity(plan, verdicts.get(plan.plan_id)):
                await self._trajectory(pending)
                pending = []
                out.append(await self.progress(event))
            else:
                pending.append(event)
                out.append(Progress())
        await self._trajectory(pending)
        return out

    async def _trajectory(self, events: Sequence[Envelope[JobProgressV1]]) -> None:
        """Reports that are neither fenced nor compared: signs of life, and trajectory."""
        if not events:
            return
        await self.state.update_watches(
            liveness.alive_changes(
                (e.data.job_id, e.data.run_id, e.data.attempt, e.time, e.data.step) for e in events
            )
        )
        points: dict[str, list[Point]] = {}
        for e in events:
            d = e.data
            points.setdefault(d.job_id, []).append(
                Point(
                    step=d.step,
                    at=e.time,
                    attempt=d.attempt,
                    data_position=d.data_position,
                    rng_fingerprint=d.rng_fingerprint,
                    metrics=d.metrics,
                )
            )
        await self.state.record_progress_many(points)
