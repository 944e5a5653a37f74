"""What ends a running attempt from outside, for the runner (`ckpt_ha.runner.runner`).

Four things stop an attempt that has not failed by itself, and each changes how its end is
reported (`Stops.as_stopped`):

- a signal to the runner (SIGTERM / SIGINT): passed on to the attempt; the runner then exits
  128 + the signal;
- ``ckpt-ha job stop J`` (``job.stop_requested``, heard on the runner's own subscription): the
  attempt gets SIGTERM (and SIGCONT, should it be stopped), its failure is reported as cause
  ``cancelled`` (never restored) and the run ends;
- a chosen rollback (``ckpt-ha job restore J --to CKPT``): a ``resume.planned`` for the next
  attempt heard while this one runs, not a fallback; the attempt is killed, reported as
  ``preempted`` ("ended for the rollback to …"), and the runner carries out the plan;
- its own plan stopped for its shape (``resume.escalated`` naming the running attempt's plan:
  weighed again for the shape this attempt started on, its checkpoint cannot load there); the
  attempt is killed before it trains on it, reported as ``preempted``, and the escalation ends
  the run.
"""

from __future__ import annotations

import asyncio
import logging
import signal as signals
from collections.abc import Callable
from dataclasses import replace

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG, EventData
from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.errors import ContractError
from ckpt_ha.contracts.job import FailureCause, JobStopRequestedV1
from ckpt_ha.contracts.resume import ResumeEscalatedV2, ResumePlannedV2
from ckpt_ha.contracts.subjects import job_event_filter
from ckpt_ha.runner.adapter import SchedulerAdapter
from ckpt_ha.runner.domain import Failure

log = logging.getLogger("ckpt_ha.runner")


class Stops:
    """The stops of one run: what was asked, and the attempt running now (which a rollback or
    a withdrawn plan concerns)."""

    def __init__(
        self,
        cfg: BusConfig,
        job_id: str,
        run_id: str,
        adapter: SchedulerAdapter,
        say: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.job_id = job_id
        self.run_id = run_id
        self.adapter = adapter
        self.say = say
        self.stopped_by: int | None = None
        """The signal the runner was stopped with (SIGTERM for ``ckpt-ha job stop``)."""
        self.stopping = asyncio.Event()
        self.request: JobStopRequestedV1 | None = None
        """The operator's ``ckpt-ha job stop`` (None: none)."""
        self.running: int | None = None
        """The attempt running now (None: between attempts)."""
        self.running_plan: str | None = None
        """The plan the running attempt carries out (None: none, or between attempts)."""
        self.rollback: ResumePlannedV2 | None = None
        """A plan for the next attempt heard while this one ran (`ckpt-ha job restore`)."""
        self.withdrawn: ResumeEscalatedV2 | None = None
        """The escalation that stopped the running attempt's plan for its shape."""

    def on_signal(self, sig: int) -> None:
        self.stopped_by = sig
        self.stopping.set()
        self.adapter.kill(sig)

    # --- `ckpt-ha job stop`: job.stop_requested ends the run ---

    async def watch(self, nc: NatsClient) -> None:
        """Subscribe to the job's stop requests (before the first attempt starts)."""
        subject = job_event_filter(self.cfg.prefix, JobStopRequestedV1.EVENT_TYPE, self.job_id)
        await nc.subscribe(subject, cb=self._on_stop_requested)

    async def _on_stop_requested(self, msg: Msg) -> None:
        """An operator asked to stop the job: the attempt gets SIGTERM and the run ends (its
        failure is reported as cancelled, so it is never restored)."""
        try:
            data = admit(self.cfg, CATALOG, msg.data, msg.subject, msg.headers).data
        except ContractError as exc:
            log.warning("ignoring an undecodable message on %s: %s", msg.subject, exc)
            return
        if not isinstance(data, JobStopRequestedV1) or data.job_id != self.job_id:
            return
        self.say(f"stop asked by {data.actor}" + (f": {data.reason}" if data.reason else ""))
        self.request = data
        self.on_signal(signals.SIGTERM)
        self.adapter.kill(signals.SIGCONT)  # a stopped (SIGSTOP) attempt gets it too

    # --- a plan or an escalation heard while the attempt runs ---

    def heard(self, data: EventData) -> None:
        """A plan or an escalation of the job (the runner's subscription)."""
        self._end_for_rollback(data)
        self._end_for_escalation(data)

    def _end_for_rollback(self, data: EventData) -> None:
        """A plan for the next attempt while this one runs (not a fallback after a load
        failure): an operator chose a rollback (``ckpt-ha job restore --to``). The running
        attempt is killed (SIGKILL: it must not write a newer checkpoint on its way out, and a
        stopped process dies too); its failure is reported, then the plan is carried out."""
        if (
            isinstance(data, ResumePlannedV2)
            and self.running is not None
            and data.attempt == self.running + 1
            and data.failed_run_id == self.run_id
            and data.fallback_from is None
        ):
            self.say(f"rollback to {data.checkpoint_id} planned: ending attempt {self.running}")
            self.rollback = data
            self.adapter.kill(signals.SIGKILL)

    def _end_for_escalation(self, data: EventData) -> None:
        """The running attempt's own plan stopped: weighed again for the shape this attempt
        started on, its checkpoint cannot load there (a format that cannot reshard). The attempt
        is killed before it trains on it; the escalation ends the run."""
        if (
            isinstance(data, ResumeEscalatedV2)
            and self.running is not None
            and data.plan_id == self.running_plan
        ):
            self.say(f"plan {data.plan_id} stopped for attempt {self.running}: ending it")
            self.withdrawn = data
            self.adapter.kill(signals.SIGKILL)

    def as_stopped(self, failure: Failure) -> Failure:
        """The failure of an attempt an operator stopped (cancelled, never restored) or ended
        for a rollback (preempted)."""
        if self.rollback is not None and self.request is None:
            plan, self.rollback = self.rollback, None
            detail = f"ended for the rollback to {plan.checkpoint_id} (plan {plan.plan_id})"
            return replace(failure, cause=FailureCause.PREEMPTED, side=FailureSide.JOB,
                           detail=detail)  # fmt: skip
        if self.withdrawn is not None and self.request is None:
            detail = f"ended: its plan {self.withdrawn.plan_id} was stopped for its shape"
            return replace(failure, cause=FailureCause.PREEMPTED, side=FailureSide.JOB,
                           detail=detail)  # fmt: skip
        stop = self.request
        if stop is None:
            return failure
        why = f": {stop.reason}" if stop.reason else ""
        detail = f"stopped by {stop.actor} (ckpt-ha job stop){why}"
        return replace(failure, cause=FailureCause.CANCELLED, side=FailureSide.JOB, detail=detail)
