"""What every drill scenario shares: the `Drill` (the job under `ckpt-ha run`, its budget, the
faults injected, the event stream read back) and the probes scenarios wait on.

I/O lives here and in the scenarios (processes, signals, NATS, Redis); what the evidence proves
is decided in `ckpt_ha.lab.drill.assess`, purely.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG, Envelope, EventData
from ckpt_ha.contracts.job import JobPolicy, Tolerance
from ckpt_ha.contracts.subjects import job_token
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.lab.devstack import stack
from ckpt_ha.lab.drill.assess import assess_restore
from ckpt_ha.lab.drill.workloads import NUMPY, Workload
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime import local_stack
from ckpt_ha.storage import ObjectStore, open_store

T = TypeVar("T")

DRILL_ENV = {
    # A drill is short: a stalled write is declared failed quickly, scrubs stay out of the way.
    "CKPT_HA_STALL_TIMEOUT_S": "5",
    "CKPT_HA_SCRUB_INTERVAL_S": "0",
}


class DrillFailed(Exception):
    """The drill could not run to the end (budget exceeded, the job exited early)."""


@dataclass
class Drill:
    home: Path
    state: local_stack.StackState
    job: str
    budget_s: float
    log: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    runner: subprocess.Popen[bytes] | None = None
    runner_log: Path | None = None
    scenario: str = ""
    job_args: list[str] = field(default_factory=list)
    workload: Workload = NUMPY
    faults: list[tuple[str, datetime]] = field(default_factory=list)
    """Every fault injected, with the moment it took effect (the report marks them)."""

    # -- plumbing -------------------------------------------------------------------------

    def cfg(self) -> BusConfig:
        """The stack's NATS, as an operator (the drill reads the event stream back)."""
        return local_stack.bus_config(self.state)

    def registry(self) -> Registry:
        """The stack's registry, as an operator; the caller closes it."""
        return Registry.from_url(local_stack.redis_config(self.state))

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Registry]:
        """The registry a scenario reads while its job runs; at the end, however the scenario
        ends, what still runs of the job is killed (`stop`) and the registry closed."""
        registry = self.registry()
        try:
            yield registry
        finally:
            self.stop()
            await registry.close()

    @property
    def on_s3(self) -> bool:
        return urlsplit(self.state.storage_root).scheme == "s3"

    def store(self) -> ObjectStore:
        """The stack's storage, reached as its services reach it (through the storage link on
        S3, the endpoint and credentials otherwise the environment's)."""
        if self.on_s3:
            return open_store(self.state.storage_root,
                              endpoint_url=self.state.storage_endpoint or None)  # fmt: skip
        return open_store(self.state.storage_root)

    def remaining(self) -> float:
        left = self.budget_s - (time.monotonic() - self.started)
        if left <= 0:
            raise DrillFailed(
                f"budget exceeded: the time budget of {self.budget_s:.0f} s is used up"
            )
        return left

    def progress(self, line: str) -> None:
        """One readable progress line: scenario, seconds used of the budget, what happens."""
        used = time.monotonic() - self.started
        self.log(f"[{self.scenario} {used:6.1f}s/{self.budget_s:.0f}s] {line}")

    def fault(self, what: str, at: datetime | None = None) -> datetime:
        """Record a fault; ``at``: the moment it took effect when taken before it was injected
        (a kill: the runner may see the death before this process runs again)."""
        at = at if at is not None else datetime.now(UTC)
        self.faults.append((what, at))
        self.progress(f"fault: {what}")
        return at

    async def until(
        self, probe: Callable[[], Awaitable[T | None]], what: str, every: float = 0.2
    ) -> T:
        """Poll ``probe`` until it returns something, within the drill's budget."""
        if what != "exit":
            self.progress(f"waiting for {what}")
        while True:
            try:
                self.remaining()
            except DrillFailed as exc:
                raise DrillFailed(f"{exc} while waiting for {what}") from None
            value = await probe()
            if value is not None and value is not False and value != []:
                return value
            if self.runner is not None and self.runner.poll() is not None and what != "exit":
                raise DrillFailed(
                    f"the job's runner exited ({self.runner.returncode}) while waiting for {what}"
                    f"; see {self.runner_log}"
                )
            await asyncio.sleep(every)

    async def events(self) -> list[Envelope[EventData]]:
        cfg = self.cfg()
        subject = f"{cfg.prefix}.ev.*.*.*.{job_token(self.job)}"
        events, _ = await read_events(cfg, CATALOG, subject, idle_timeout=2.0)
        return events

    async def records(self, registry: Registry) -> list[CheckpointRecord]:
        return await registry.by_job(self.job)

    # -- the job ---------------------------------------------------------------------------

    def launch(
        self,
        policy: JobPolicy,
        job_args: list[str],
        env: Mapping[str, str],
        workload: Workload = NUMPY,
        runner_args: Sequence[str] = (),
    ) -> None:
        """Start the job under `ckpt-ha run` (with ``runner_args``, e.g. its scheduler)."""
        folder = self.home / "drills" / self.job
        folder.mkdir(parents=True, exist_ok=True)
        policy_file = folder / "policy.json"
        policy_file.write_text(policy.model_dump_json(indent=2))
        self.runner_log = folder / "runner.log"
        self.job_args = list(job_args)
        self.workload = workload
        argv = [
            sys.executable, "-m", "ckpt_ha.cli.main", "run", "--job", self.job,
            "--policy", str(policy_file), "--plan-timeout", "60", *runner_args, "--",
            *workload.argv(job_args),
        ]  # fmt: skip
        full_env = {
            **os.environ,
            **env,
            "CKPT_HA_HOME": str(self.home),
            "NATS_URL": self.state.nats_url,
            "REDIS_URL": self.state.redis_url,
            "CKPT_HA_STORAGE_ROOT": self.state.storage_root,
            **stack.storage_env(self.state),
            **local_stack.login_env(self.state, local_stack.RUNNER),
        }
        with self.runner_log.open("ab") as out:
            self.runner = subprocess.Popen(
                argv, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def training_pid(self) -> int | None:
        """The training process: the runner's child (whatever adapter started it)."""
        if self.runner is None:
            return None
        try:
            children = Path(f"/proc/{self.runner.pid}/task/{self.runner.pid}/children")
            pids = [int(p) for p in children.read_text().split()]
        except (OSError, ValueError):
            return None
        return pids[0] if pids else None

    def rank_pids(self) -> list[int]:
        """The training processes a launcher started (torchrun's ranks), oldest first; the
        training process itself when it is no launcher."""
        top = self.training_pid()
        if top is None:
            return []
        found: list[int] = []
        for children in Path(f"/proc/{top}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                found += [int(p) for p in children.read_text().split()]
        return sorted(found) or [top]

    async def kill_rank(self, index: int) -> datetime:
        """SIGKILL one rank of a multi-process job (by launch order)."""

        async def ranks() -> list[int] | None:
            pids = self.rank_pids()
            return pids if len(pids) > index else None

        pid = (await self.until(ranks, f"rank {index}'s process"))[index]
        at = datetime.now(UTC)
        os.kill(pid, signal.SIGKILL)
        return self.fault(f"SIGKILL rank {index} (pid {pid})", at)

    async def kill_training(self) -> datetime:
        pid = await self.until(lambda: as_awaitable(self.training_pid()), "the training process")
        os.kill(pid, signal.SIGKILL)
        return self.fault(f"SIGKILL training process {pid}")

    async def wait_exit(self) -> int:
        async def done() -> int | None:
            return None if self.runner is None else self.runner.poll()

        return await self.until(done, "exit")

    def stop(self) -> None:
        if self.runner is not None and self.runner.poll() is None:
            os.killpg(self.runner.pid, signal.SIGKILL)
            self.runner.wait(timeout=10)


async def as_awaitable(value: T) -> T:
    """``value``, awaitable (for `Drill.until` probes that need no I/O)."""
    return value


def policy() -> JobPolicy:
    return JobPolicy(
        tier="drill",
        max_restarts=3,
        tolerances=(Tolerance(metric="loss"),),  # exact: the example job is deterministic
        continuity_steps=3,
    )


async def valid_count(drill: Drill, registry: Registry, n: int) -> list[CheckpointRecord] | None:
    valid = [r for r in await drill.records(registry) if r.state.value == "valid"]
    return valid if len(valid) >= n else None


async def progress_at_least(drill: Drill, step: int) -> bool | None:
    events = await drill.events()
    return (
        any(
            e.type.endswith("job.progress.v1") and (e.data.__dict__.get("step") or 0) >= step
            for e in events
        )
        or None
    )


async def resumed_after(drill: Drill, fault: datetime) -> list[Envelope[EventData]] | None:
    events = await drill.events()
    done = [
        e
        for e in events
        if e.time >= fault and e.type.split(".")[1:3] in (["resume", "verified"],
                                                           ["resume", "diverged"])
    ]  # fmt: skip
    return done or None


async def uncommitted_writes(drill: Drill, since: datetime | None = None) -> dict[str, Path]:
    """Checkpoints announced ``writing`` (after ``since``) and not committed: id → local folder."""
    events = await drill.events()
    done = {e.data.__dict__.get("checkpoint_id") for e in events
            if ".checkpoint.committed.v" in e.type}  # fmt: skip
    return {
        str(e.data.__dict__["checkpoint_id"]): Path(str(e.data.__dict__.get("uri") or "")
                                                    .removeprefix("file://"))
        for e in events
        if ".checkpoint.writing.v" in e.type and (since is None or e.time > since)
        and e.data.__dict__.get("checkpoint_id") not in done
    }  # fmt: skip


async def escalated(drill: Drill) -> list[Envelope[EventData]] | None:
    events = await drill.events()
    return [e for e in events if e.event_type == "resume.escalated"] or None


def expect_escalation(
    scenario: str, drill: Drill, events: list[Envelope[EventData]], fault: datetime, code: int,
    reasons: set[str],
) -> dict[str, Any]:  # fmt: skip
    phase = assess_restore(scenario, events, drill.job, fault)
    result = phase.to_json()
    escalations = [e for e in events if e.event_type == "resume.escalated"]
    last = escalations[-1] if escalations else None
    after = [e for e in events if last is not None and e.time > last.time
             and e.event_type in ("resume.planned", "job.started")]  # fmt: skip
    result["escalation"] = (
        {"event_id": last.id, **last.data.model_dump(mode="json")} if last else None
    )
    result["job"], result["job_exit_code"] = drill.job, code
    # The drill passes by stopping the restore: no level is required of the checkpoint the
    # system planned (any reached is still shown as passed).
    result["expected_levels"] = []
    checks = {
        "escalated": last is not None,
        f"for {' or '.join(sorted(reasons))}": last is not None
        and last.data.__dict__.get("reason") in reasons,
        "no restore or attempt after the escalation": not after,
        "the runner stopped (exit 6)": code == 6,
    }
    result["checks"] = checks
    result["reasons"] = [f"not met: {what}" for what, ok in checks.items() if not ok]
    result["verdict"] = "pass" if all(checks.values()) else "fail"
    return result
