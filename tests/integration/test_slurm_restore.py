"""`ckpt-ha run --scheduler slurm` against a real Slurm (the session's private single-node
cluster), with the real registrar, integrity-checker and restore-coordinator in-process on real
NATS and Redis.

The example job saves checkpoints with the SDK; once one is valid the test ends the Slurm job
the way a platform would: the node set DOWN, ``scancel --batch --signal=KILL``, a job in the
``high`` partition preempting it, or a user's ``scancel``. The first three are classified
(``node_lost``, ``node_exit``, ``preempted``; ``reported_by`` slurm), planned by the
coordinator, and the runner submits a new batch job with the restore target, which loads the
checkpoint and finishes. A user's cancel (plain, or ``--signal=KILL``, which Slurm reports
identically) is ``cancelled``: no plan, no escalation, the runner exits 5.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest

from ckpt_ha.contracts import CATALOG, EventData
from ckpt_ha.contracts.job import FailureCause, JobFailedV2, JobStartedV1, JobSucceededV1
from ckpt_ha.contracts.resume import ResumeEscalatedV2, ResumeLoadedV1, ResumePlannedV2
from ckpt_ha.integrity_checker.app import IntegrityChecker
from ckpt_ha.lab.devstack import slurm
from ckpt_ha.lab.devstack.slurm import SlurmCluster
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.runner.runner import ATTEMPT_FILE, state_dir
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import stack_env
from tests.support.slurm import Probe

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 60, 10


@pytest.fixture
def settings(settings: ServiceSettings, tmp_path: Path) -> ServiceSettings:
    """One storage root for the job, the registrar, the checker and the coordinator."""
    (tmp_path / "storage").mkdir()
    return settings.model_copy(update={"storage_root": str(tmp_path / "storage")})


@pytest.fixture
async def services(
    settings: ServiceSettings, registrar: Registrar, checker: IntegrityChecker
) -> AsyncIterator[RestoreCoordinator]:
    """The three services a restore needs: valid checkpoints, then a plan."""
    coord = build_coordinator(
        RestoreCoordinatorSettings.model_validate(
            {**settings.model_dump(), "load_failed_grace_s": 1.0}
        )
    )
    await coord.bus.broker.start()
    yield coord
    await coord.bus.broker.stop()
    await coord.state.close()


@dataclass
class SlurmRun:
    """One `ckpt-ha run --scheduler slurm` process and what it printed."""

    proc: asyncio.subprocess.Process
    home: Path
    job: str
    run_id: str
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    pump: asyncio.Task[None] | None = None

    async def _pump(self) -> None:
        async def read(stream: asyncio.StreamReader | None, into: list[str]) -> None:
            assert stream is not None
            async for line in stream:
                into.append(line.decode().rstrip("\n"))

        await asyncio.gather(
            read(self.proc.stdout, self.stdout), read(self.proc.stderr, self.stderr)
        )

    def slurm_job(self, attempt: int) -> str | None:
        """The Slurm job id of ``attempt`` once submitted (the runner's attempt file)."""
        path = state_dir(self.home, self.job, self.run_id) / ATTEMPT_FILE
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads(path.read_text())
            if doc["attempt"] == attempt:
                return str(doc["handle"]).removeprefix("slurm job ")
        return None

    def steps(self, attempt: int) -> list[int]:
        """The steps ``attempt`` printed (its Slurm output, copied to the runner's stdout)."""
        docs = [json.loads(line) for line in self.stdout if line.startswith('{"step"')]
        return [d["step"] for d in docs if d["attempt"] == attempt]

    async def finish(self, timeout: float = 90) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout=timeout)
        assert self.pump is not None
        await asyncio.wait_for(self.pump, timeout=10)
        return code


async def start_run(
    settings: ServiceSettings, cluster: SlurmCluster, tmp_path: Path, job: str, *args: str
) -> SlurmRun:
    home = tmp_path / "home"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CKPT_HA_", "SLURM_")) and k not in ("NATS_URL", "REDIS_URL")
    }
    env.update(
        {
            "CKPT_HA_HOME": str(home),
            **stack_env(settings),
            **cluster.env,
            "CKPT_HA_STORAGE_ROOT": settings.storage_root,
            "CKPT_HA_CODE_VERSION": "test-code-1",
            "PYTHONPATH": os.pathsep.join(sys.path),  # the batch job imports this checkout
        }
    )
    run_id = f"run-{job}"
    command = [
        sys.executable, "-m", "ckpt_ha.lab.examples.numpy_mlp", "--steps", str(STEPS),
        "--checkpoint-every", str(EVERY), "--seed", "5", "--sleep-per-step", "0.1",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ckpt_ha.cli.main", "run", "--scheduler", "slurm", "--job", job,
        "--run-id", run_id, "--plan-timeout", "60", *args, "--", *command,
        env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    run = SlurmRun(proc, home, job, run_id)
    run.pump = asyncio.create_task(run._pump())
    return run


async def events_of(settings: ServiceSettings, job: str) -> list[EventData]:
    found = []
    for msg in await stream_messages(settings.nats_url, settings.events_stream):
        data = CATALOG.decode(msg.data).data
        if data.job_id == job:
            found.append(data)
    return found


async def running_past_a_valid_checkpoint(
    run: SlurmRun, registrar: Registrar, cluster: SlurmCluster
) -> str:
    """Wait until attempt 1 runs and has a valid checkpoint; its Slurm job id."""

    async def ready() -> str | None:
        slurm_job = run.slurm_job(1)
        if slurm_job is None or cluster.job(slurm_job).get("JobState") != "RUNNING":
            return None
        records = await registrar.registry.by_job(run.job)
        return slurm_job if any(r.state.value == "valid" for r in records) else None

    return await wait_for(ready, timeout=60, what="attempt 1 running past a valid checkpoint")


def inject(cluster: SlurmCluster, cause: str, job: str) -> None:
    """End the running Slurm job ``job`` so that it must be classified ``cause``."""
    if cause == "node_lost":
        cluster.run("scontrol", "update", f"nodename={slurm.NODE}", "state=down", "reason=test")
    elif cause == "node_exit":
        cluster.run("scancel", "--batch", "--signal=KILL", job)
    else:  # a short job in the high partition that needs the whole node
        cluster.run(
            "sbatch", "--parsable", f"--partition={slurm.HIGH_PARTITION}",
            f"--cpus-per-task={cluster.cpus}", f"--output={cluster.home}/urgent-%j.out",
            "--wrap", "sleep 3",
        )  # fmt: skip


CAUSES = ("node_lost", "node_exit", "preempted")
FINAL = {"node_lost": "NODE_FAIL", "node_exit": "FAILED", "preempted": "PREEMPTED"}


@pytest.mark.parametrize("cause", CAUSES)
async def test_a_slurm_failure_is_classified_planned_and_resumed_from_the_restore_target(
    settings: ServiceSettings,
    services: RestoreCoordinator,
    registrar: Registrar,
    slurm_cluster: SlurmCluster,
    probe: Probe,
    tmp_path: Path,
    unique: str,
    cause: str,
) -> None:
    cluster, job = slurm_cluster, f"slurm-{cause.replace('_', '-')}-{unique}"
    # The whole node: a job in the high partition needs it all, so it preempts this one.
    run = await start_run(
        settings, cluster, tmp_path, job, f"--sbatch-arg=--cpus-per-task={cluster.cpus}"
    )
    first = await running_past_a_valid_checkpoint(run, registrar, cluster)
    inject(cluster, cause, first)

    assert await run.finish() == 0, "\n".join(run.stderr)
    seen = await events_of(settings, job)
    [failed] = [d for d in seen if isinstance(d, JobFailedV2)]
    assert (failed.cause.value, failed.reported_by, failed.attempt) == (cause, "slurm", 1)
    assert failed.last_step is not None
    assert cluster.job(first)["JobState"] == FINAL[cause]
    [plan] = [d for d in seen if isinstance(d, ResumePlannedV2)]
    assert (plan.attempt, plan.failed_run_id) == (2, run.run_id)
    # A new batch job, which got the plan: it loaded the restore target and went on from it.
    second = run.slurm_job(2)
    assert second is not None
    assert second != first
    assert cluster.job(second)["JobState"] == "COMPLETED"
    [start2] = [d for d in seen if isinstance(d, JobStartedV1) and d.attempt == 2]
    assert (start2.plan_id, start2.restored_from) == (plan.plan_id, plan.checkpoint_id)
    [loaded] = [d for d in seen if isinstance(d, ResumeLoadedV1)]
    assert (loaded.plan_id, loaded.step) == (plan.plan_id, plan.step)
    assert run.steps(2) == list(range(plan.step + 1, STEPS + 1))
    assert any(isinstance(d, JobSucceededV1) and d.attempt == 2 for d in seen)
    assert f"attempt 1 failed: {cause}" in "\n".join(run.stderr)


@pytest.mark.parametrize("how", [(), ("--signal=KILL",)])
async def test_a_users_scancel_is_cancelled_and_never_restored(
    settings: ServiceSettings,
    services: RestoreCoordinator,
    registrar: Registrar,
    slurm_cluster: SlurmCluster,
    probe: Probe,
    tmp_path: Path,
    unique: str,
    how: tuple[str, ...],
) -> None:
    cluster, job = slurm_cluster, f"slurm-cancel-{unique}"
    run = await start_run(settings, cluster, tmp_path, job)
    first = await running_past_a_valid_checkpoint(run, registrar, cluster)
    cluster.run("scancel", *how, first)

    assert await run.finish(timeout=30) == 5
    err = "\n".join(run.stderr)
    assert "attempt 1 failed: cancelled" in err
    assert "was cancelled by a user: the run ends here, nothing is restored" in err
    seen = await events_of(settings, job)
    [failed] = [d for d in seen if isinstance(d, JobFailedV2)]
    assert (failed.cause, failed.reported_by) == (FailureCause.CANCELLED, "slurm")

    # Once the coordinator has handled the failure (its consumer caught up): neither a plan
    # nor an escalation (a page), and nothing resubmitted.
    await wait_for(lambda: failures_handled(settings), what="the coordinator to handle it")
    seen = await events_of(settings, job)
    assert not [d for d in seen if isinstance(d, ResumePlannedV2 | ResumeEscalatedV2)]
    assert run.slurm_job(2) is None
    assert cluster.jobs() == []  # nothing resubmitted


async def failures_handled(settings: ServiceSettings) -> bool:
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        info = await js.consumer_info(settings.events_stream, "restore-coordinator--failed")
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()
