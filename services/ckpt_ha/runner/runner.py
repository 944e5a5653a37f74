"""`ckpt-ha run`: one training run, attempt after attempt, until it succeeds or a human must act.

For each attempt the runner publishes ``job.started`` (the policy, and the environment,
topology and code version that a restore is checked against), launches the command through a
`SchedulerAdapter` with the environment-variable protocol of `ckpt_ha.sdk.context`, and when it
ends publishes ``job.succeeded`` or ``job.failed``. After a failure it waits (bounded) for the
restore-coordinator: ``resume.planned`` for the next attempt → relaunch with the plan;
``resume.escalated`` → print the reason and the runbook's next step, exit 6; nothing within
``--plan-timeout`` → exit 4. An attempt a user cancelled (the scheduler says so: ``scancel``)
is reported as ``job.failed`` cause ``cancelled`` and ends the run at once, exit 5: no plan is
awaited, the coordinator never restores it. SIGTERM / SIGINT are passed on to the attempt,
then the runner exits 128 + the signal.
``ckpt-ha job stop J`` (``job.stop_requested``, heard like the plans) stops the attempt the same
way, reports its failure as cause ``cancelled`` (never restored) and ends the run, exit 5.
A ``resume.planned`` for the next attempt heard while an attempt runs (not a fallback) is a
chosen rollback (``ckpt-ha job restore J --to CKPT``): the running attempt is killed, reported
as ``preempted`` ("ended for the rollback to …"), and the plan is carried out.

A torchrun command gets a per-attempt ``TORCHELASTIC_ERROR_FILE`` so that a failed rank's cause
reaches ``job.failed`` (`ckpt_ha.runner.torchrun`). When torchrun restarts its ranks itself
(``--max-restarts`` > 0) the runner only sees, reports and acts on torchrun's final exit.

The runner listens with a plain NATS subscription, opened before the attempt starts, so a plan
published while the failure is being reported is not missed.

Heartbeats. Each ``job.started`` (v2) promises a ``job.heartbeat`` every ``--heartbeat-s``
(default ``CKPT_HA_HEARTBEAT_S``, 10 s; 0: none, and the attempt is then never declared lost)
and names the silence after which the attempt is lost (``--deadline-s``, default
``CKPT_HA_DEADLINE_S``, else the job's tier's, `ckpt_ha.core.tiers.Tier.lost_after_s`).
While an attempt runs, a task of the runner publishes the heartbeats (signed like every job
event), whatever the training reports: a slow job whose runner lives is never lost. If the
runner's host dies (runner and training gone, no ``job.failed``), the restore-coordinator
declares the attempt lost after the deadline and plans its restore.

Taking over a lost run (``--resume``). A new runner with the same ``--job`` and ``--run-id``
(and ``CKPT_HA_HOME``: the run's state folder holds `ATTEMPT_FILE`) reads the attempt that was
running, then waits (``--plan-timeout``) for the coordinator's plan for the next attempt and
carries on from it like the normal loop (an escalation: exit 6). A plan published before it
subscribed is found too: it reads the job's last ``resume.planned`` / ``resume.escalated``
from the stream (``STREAM.MSG.GET``, allowed to the ``runner`` principal). It never starts the
lost attempt again by itself: a run with no plan exits 4. Make sure the old attempt's
processes are gone first (a host that is really dead; `kill` otherwise): until fencing, an old
attempt still running would write next to the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal as signals
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import last_event
from ckpt_ha.contracts import CATALOG, EventData, build
from ckpt_ha.contracts.checkpoint import Topology
from ckpt_ha.contracts.errors import ContractError
from ckpt_ha.contracts.job import (
    MAX_STALLED_RANKS,
    FailureCause,
    JobFailedV2,
    JobFailedV3,
    JobHeartbeatV1,
    JobStartedV2,
    JobSucceededV1,
)
from ckpt_ha.contracts.resume import ResumeEscalatedV2, ResumePlannedV2
from ckpt_ha.contracts.subjects import job_event_filter, job_token
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.runner import hangwatch, torchrun
from ckpt_ha.runner.adapter import ExitInfo, SchedulerAdapter
from ckpt_ha.runner.domain import classify
from ckpt_ha.runner.hang import HangPolicy, as_failure
from ckpt_ha.runner.launch import RunSpec, child_env, runtime_environment
from ckpt_ha.runner.stops import Stops

if TYPE_CHECKING:
    from ckpt_ha.bus.broker import Bus

log = logging.getLogger("ckpt_ha.runner")
SOURCE = "ckpt-ha/runner"
EXIT_OK, EXIT_FAILED, EXIT_ESCALATED, EXIT_NO_PLAN, EXIT_CANCELLED = 0, 1, 6, 4, 5
"""`ckpt_ha.cli.errors.Exit`: 3 is an unreachable dependency for every command, so an
escalation is 6."""
ATTEMPT_FILE = "attempt.json"
"""In the run's state folder: the running attempt's number and scheduler handle (its pid)."""


class CannotResume(Exception):
    """``--resume`` found no attempt of this run to take over."""

    def __init__(self, state_dir: Path, reason: str) -> None:
        self.state_dir = state_dir
        super().__init__(f"cannot resume the run in {state_dir}: {reason}")


class LaunchFailed(Exception):
    """The scheduler could not start the command at all (not found, not executable)."""

    def __init__(self, command: str, reason: str) -> None:
        self.command = command
        super().__init__(f"cannot start {command!r}: {reason}")


class Runner:
    def __init__(
        self,
        spec: RunSpec,
        bus: BusConfig,
        adapter: SchedulerAdapter,
        *,
        base_env: Mapping[str, str],
        job_bus: BusConfig | None = None,
        out: TextIO = sys.stderr,
        clock: Clock = utc_now,
    ) -> None:
        self.spec = spec
        self.cfg = bus
        self.job_cfg = job_bus if job_bus is not None else bus
        """What the training process connects with; the runner's own credentials when no job
        credentials are configured (a NATS without a ``job`` user)."""
        self.adapter = adapter
        self.base_env = dict(base_env)
        self.out = out
        self.clock = clock
        self.environment = runtime_environment(spec.image)
        self.elastic_restarts = torchrun.max_restarts(spec.command, self.base_env)
        self._inbox: asyncio.Queue[EventData] = asyncio.Queue()
        self._nc: NatsClient | None = None
        self.stops = Stops(bus, spec.job_id, spec.run_id, adapter, self.say)

    def say(self, text: str) -> None:
        print(f"ckpt-ha run: {text}", file=self.out, flush=True)

    async def run(self) -> int:
        from ckpt_ha.bus.broker import Bus  # faststream: only when a run really starts

        # Nothing to take over: said before anything connects.
        lost = self._recorded_attempt() if self.spec.resume else None
        bus = Bus(self.cfg, "runner", lasting=True)
        # Fail fast (one line, nothing started) when NATS is not there at all; the connections
        # kept for the run then reconnect, however long NATS is away, while the training runs.
        probe = await nats.connect(
            self.cfg.servers,
            **self.cfg.connect_options(),
            connect_timeout=self.cfg.connect_timeout_s,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,
            error_cb=_quiet,
        )
        await probe.close()
        nc = await nats.connect(
            self.cfg.servers,
            **self.cfg.connect_options(),
            **self.cfg.connection_policy(lasting=True),
            name=f"ckpt-ha-runner-{self.spec.job_id}",
            error_cb=_log_error,
        )
        loop = asyncio.get_running_loop()
        for sig in (signals.SIGTERM, signals.SIGINT):
            loop.add_signal_handler(sig, self.stops.on_signal, sig)
        try:
            for event in ("resume.planned", "resume.escalated"):
                await nc.subscribe(
                    job_event_filter(self.cfg.prefix, event, self.spec.job_id), cb=self._on_msg
                )
            await self.stops.watch(nc)
            await nc.flush()
            self._nc = nc
            await bus.broker.start()
            try:
                return await self._attempts(bus, lost)
            finally:
                await bus.broker.stop()
        finally:
            for sig in (signals.SIGTERM, signals.SIGINT):
                loop.remove_signal_handler(sig)
            await nc.close()

    async def _on_msg(self, msg: Msg) -> None:
        try:
            envelope = admit(self.cfg, CATALOG, msg.data, msg.subject, msg.headers)
        except ContractError as exc:
            log.warning("ignoring an undecodable message on %s: %s", msg.subject, exc)
            return
        await self._inbox.put(envelope.data)
        self.stops.heard(envelope.data)

    def _stopped_exit(self) -> int | None:
        if self.stops.request is not None:
            self.say("the run ends here: stopped by an operator (`ckpt-ha job show` tells)")
            return EXIT_CANCELLED
        stopped_by = self.stops.stopped_by
        return 128 + stopped_by if stopped_by is not None else None

    async def _publish(self, bus: Bus, data: EventData, key: str) -> None:
        await bus.publish(build(data, source=SOURCE, time=self.clock(), key=key))

    async def _attempts(self, bus: Bus, lost: int | None = None) -> int:
        """Attempt after attempt; ``lost``: the attempt of a run taken over (``--resume``)."""
        spec = self.spec
        attempt, plan = 1, None
        if self.elastic_restarts:
            self.say(
                f"torchrun restarts its ranks itself (--max-restarts {self.elastic_restarts}); "
                "ckpt-ha reports a failure and relaunches only when torchrun gives up"
            )
        if lost is not None:
            self.say(f"taking over run {spec.run_id}: waiting for the plan after attempt {lost}")
            await self._find_published(lost)
            found = await self._next(lost)
            if isinstance(found, int):
                return found
            attempt, plan = found
        while True:
            if self.stops.stopped_by is not None:  # asked to stop before this attempt started
                return self._stopped_exit() or 128 + self.stops.stopped_by
            started = JobStartedV2(
                job_id=spec.job_id,
                run_id=spec.run_id,
                attempt=attempt,
                tier=spec.policy.tier,
                restored_from=plan.checkpoint_id if plan else None,
                plan_id=plan.plan_id if plan else None,
                policy=spec.policy,
                environment=self.environment,
                topology=Topology(world_size=spec.world_size),
                code_version=spec.code_version,
                command=spec.command,
                heartbeat_s=spec.heartbeat_s,
                deadline_s=spec.deadline_s if spec.heartbeat_s is not None else None,
            )
            key = f"{spec.job_id}|{spec.run_id}|{attempt}"
            await self._publish(bus, started, f"job.started|{key}")
            beats = None
            if spec.heartbeat_s is not None:
                beats = asyncio.create_task(self._heartbeats(bus, attempt, spec.heartbeat_s))
            hangs = self._watch_hangs()
            self.stops.running, self.stops.running_plan = attempt, plan.plan_id if plan else None
            try:
                info = await self._one_attempt(attempt, plan)
                if info.rank is not None:  # a torchrun group's rank: when the runner saw it
                    running = "torchrun still runs" if info.group_running else "torchrun exited"
                    self.say(f"attempt {attempt}: a rank failed ({running}; seen at "
                             f"{self.clock().isoformat()})")  # fmt: skip
            finally:
                self.stops.running = self.stops.running_plan = None
                if beats is not None:
                    beats.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await beats
                hung = await hangwatch.outcome(hangs)
            last_step = self._last_step()
            failure = classify(
                info, forwarded=self.stops.stopped_by, elastic_restarts=self.elastic_restarts or 0
            )
            failure = self.stops.as_stopped(failure) if failure is not None else None
            if hung is not None and self.stops.stopped_by is None and self.stops.request is None:
                failure = as_failure(hung, info.exit_code, info.signal)
                last_step = hung.last_step if hung.last_step is not None else last_step
            if failure is None:
                done = JobSucceededV1(
                    job_id=spec.job_id, run_id=spec.run_id, attempt=attempt, last_step=last_step
                )
                await self._publish(bus, done, f"job.succeeded|{key}")
                self.say(f"attempt {attempt} succeeded (last step {last_step})")
                return EXIT_OK
            # Anything heard before this failure is not about it, except a plan for the next
            # attempt or an escalation: after a load failure the coordinator decides (plans
            # the fallback, or stops) while this attempt is still exiting. An escalation ends
            # the run, so none heard earlier can be pending.
            early: list[EventData] = []
            while not self._inbox.empty():
                item = self._inbox.get_nowait()
                planned = isinstance(item, ResumePlannedV2) and item.attempt == attempt + 1
                if planned or isinstance(item, ResumeEscalatedV2):
                    early.append(item)
            for item in early:
                self._inbox.put_nowait(item)
            failed = JobFailedV3(
                job_id=spec.job_id,
                run_id=spec.run_id,
                attempt=attempt,
                cause=failure.cause,
                exit_code=failure.exit_code,
                signal=failure.signal,
                last_step=last_step,
                detail=failure.detail[:2000],
                signature=failure.signature,
                side=failure.side,
                plan_id=plan.plan_id if plan else None,
                reported_by=info.reported_by,
                rank=failure.stalled_ranks[0] if failure.stalled_ranks else None,
                stalled_ranks=failure.stalled_ranks[:MAX_STALLED_RANKS],
                hang_after_s=failure.hang_after_s,
            )
            await self._publish(bus, as_published(failed), f"job.failed|{key}")
            self.say(f"attempt {attempt} failed: {failure.cause.value}: {failure.detail}")
            if info.group_running:  # reported first; now the rest of the group goes
                await asyncio.to_thread(self.adapter.stop, hangwatch.STOP_GRACE_S)
                await asyncio.to_thread(self.adapter.wait)
            if self.stops.stopped_by is not None:
                return self._stopped_exit() or 128 + self.stops.stopped_by
            if failure.cause is FailureCause.CANCELLED:
                self.say(
                    f"attempt {attempt} was cancelled by a user: the run ends here, nothing is "
                    f"restored (to go on: ckpt-ha run --job {spec.job_id} ... again)"
                )
                return EXIT_CANCELLED
            if spec.max_attempts is not None and attempt >= spec.max_attempts:
                self.say(f"giving up after {attempt} attempts (--max-attempts {spec.max_attempts})")
                return EXIT_FAILED
            found = await self._next(attempt)
            if isinstance(found, int):
                return found
            attempt, plan = found

    async def _next(self, failed: int) -> tuple[int, ResumePlannedV2] | int:
        """The plan for the attempt after ``failed`` (and its number), or the exit code."""
        spec = self.spec
        outcome = await self._await_plan(failed + 1)
        if isinstance(outcome, ResumeEscalatedV2):
            self.say(f"escalated: {outcome.reason}")
            if outcome.detail:
                self.say(f"why: {outcome.detail}")
            self.say(f"next step: {outcome.next_step}")
            self.say(f"every decision for this job: ckpt-ha restores --job {spec.job_id}")
            return EXIT_ESCALATED
        if outcome is None:
            if self.stops.stopped_by is not None:
                return self._stopped_exit() or 128 + self.stops.stopped_by
            self.say(
                f"no resume plan for attempt {failed + 1} within {spec.plan_timeout_s:g} s "
                "(is the restore-coordinator running? `ckpt-ha status`)"
            )
            return EXIT_NO_PLAN
        self.say(
            f"attempt {failed + 1}: {outcome.mode.value} from {outcome.checkpoint_id} "
            f"(step {outcome.step}, plan {outcome.plan_id})"
        )
        return failed + 1, outcome

    def _recorded_attempt(self) -> int:
        """The attempt the run's state folder says was running (`ATTEMPT_FILE`)."""
        where = self.spec.state_dir
        try:
            doc = json.loads((where / ATTEMPT_FILE).read_text())
        except FileNotFoundError:
            raise CannotResume(where, f"no {ATTEMPT_FILE}: this run never started here") from None
        except (OSError, ValueError) as exc:
            raise CannotResume(where, f"unreadable {ATTEMPT_FILE}: {exc}") from None
        attempt = doc.get("attempt") if isinstance(doc, dict) else None
        if not isinstance(attempt, int) or attempt < 1 or doc.get("run_id") != self.spec.run_id:
            raise CannotResume(where, f"{ATTEMPT_FILE} names no attempt of run {self.spec.run_id}")
        return attempt

    async def _find_published(self, failed: int) -> None:
        """Queue the job's last plan or escalation if it was published before this runner
        subscribed (taking over a lost run: the coordinator may have decided already)."""
        if self._nc is None:
            return
        js = self._nc.jetstream(timeout=self.cfg.request_timeout_s)
        for event in ("resume.planned", "resume.escalated"):
            try:
                envelope = await last_event(js, self.cfg, CATALOG, event, self.spec.job_id)
            except (nats.errors.Error, TimeoutError) as exc:  # e.g. no STREAM.MSG.GET permission
                self.say(
                    f"cannot read earlier plans from the stream ({exc!r}): waiting for new ones"
                )
                return
            if envelope is None:
                continue
            data = envelope.data
            escalated = isinstance(data, ResumeEscalatedV2) and data.attempt == failed
            if escalated or (isinstance(data, ResumePlannedV2) and data.attempt == failed + 1):
                await self._inbox.put(data)

    def _watch_hangs(self) -> hangwatch.HangWatch | None:
        """The hang watch of the attempt about to start (None: switched off)."""
        if self.spec.hang_after_s == 0:
            return None
        policy = HangPolicy(fixed_s=self.spec.hang_after_s)
        return hangwatch.start(self.spec.progress_file, policy, self.adapter, self.say)

    async def _heartbeats(self, bus: Bus, attempt: int, every_s: float) -> None:
        """``job.heartbeat`` every ``every_s`` while the attempt runs, independent of the
        training's progress; one that cannot be published (the bus is away) is skipped."""
        key = f"{self.spec.job_id}|{self.spec.run_id}|{attempt}"
        sequence = 0
        while True:
            await asyncio.sleep(every_s)
            sequence += 1
            beat = JobHeartbeatV1(
                job_id=self.spec.job_id,
                run_id=self.spec.run_id,
                attempt=attempt,
                sequence=sequence,
                last_step=await self._last_step_soon(every_s),
            )
            try:
                await asyncio.wait_for(
                    self._publish(bus, beat, f"job.heartbeat|{key}|{sequence}"), timeout=every_s
                )
            except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
                log.warning("heartbeat %d of attempt %d not published: %r", sequence, attempt, exc)

    async def _one_attempt(self, attempt: int, plan: ResumePlannedV2 | None) -> ExitInfo:
        spec = self.spec
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        spec.progress_file.unlink(missing_ok=True)
        hangwatch.clear(spec.progress_file)
        spec.error_file(attempt).unlink(missing_ok=True)
        env = child_env(self.base_env, spec, self.job_cfg, attempt, self.environment, plan)
        try:
            handle = self.adapter.start(spec.command, env)
        except OSError as exc:
            raise LaunchFailed(spec.command[0], exc.strerror or str(exc)) from None
        (spec.state_dir / ATTEMPT_FILE).write_text(
            json.dumps({"attempt": attempt, "handle": handle, "run_id": spec.run_id})
        )
        self.say(f"attempt {attempt} started ({handle})")
        return await asyncio.to_thread(self.adapter.wait)

    async def _last_step_soon(self, within_s: float) -> int | None:
        """`_last_step` read in a worker thread, None if it takes longer than ``within_s``: a
        stalled filesystem must not stall the heartbeats (the coordinator would declare a live
        attempt lost)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._last_step), timeout=within_s)
        except TimeoutError:
            return None

    def _last_step(self) -> int | None:
        try:
            return int(self.spec.progress_file.read_text().strip())
        except (OSError, ValueError):
            return None

    async def _await_plan(self, attempt: int) -> ResumePlannedV2 | ResumeEscalatedV2 | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.plan_timeout_s
        while not self.stops.stopping.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                data = await asyncio.wait_for(self._inbox.get(), timeout=min(remaining, 0.25))
            except TimeoutError:
                continue
            if isinstance(data, ResumeEscalatedV2):
                return data
            if (
                isinstance(data, ResumePlannedV2)
                and data.attempt == attempt
                and data.failed_run_id == self.spec.run_id
            ):
                return data
        return None


async def _quiet(exc: Exception) -> None:
    pass  # the probe's failure is raised and reported in one line


async def _log_error(exc: Exception) -> None:
    log.warning("NATS: %r", exc)


def as_published(failed: JobFailedV3) -> JobFailedV2:
    """``job.failed`` v3 for a hang only; any other failure as v2, which a consumer that does
    not know v3 yet still reads (it would park a v3)."""
    if failed.cause is FailureCause.HANG:
        return failed
    return JobFailedV2.model_validate(failed.model_dump(exclude={"stalled_ranks", "hang_after_s"}))


def state_dir(home: Path, job_id: str, run_id: str) -> Path:
    return home / "runs" / job_token(job_id) / job_token(run_id)
