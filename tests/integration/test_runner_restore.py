"""`ckpt-ha run` as a real process against the real broker, with the test as the coordinator.

The example job trains, the test SIGKILLs it mid-training, the runner reports ``job.failed``
(node_exit, last step), the test answers with ``resume.planned`` for the newest valid
checkpoint, the runner relaunches, the SDK restores it, and the job finishes: every loss after
the restored step has the uninterrupted run's exact float64 bits. An escalation ends the runner
with exit 3, a missing plan with exit 4, and a SIGTERM to the runner stops the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.cli.errors import Exit
from ckpt_ha.contracts import CATALOG, EventData, build
from ckpt_ha.contracts.job import JobFailedV1, JobProgressV1, JobStartedV1
from ckpt_ha.contracts.resume import ResumeEscalatedV2, ResumeLoadedV1
from ckpt_ha.contracts.subjects import job_event_filter, job_token
from ckpt_ha.formats import latest_valid
from ckpt_ha.lab.examples import numpy_mlp
from ckpt_ha.runner.runner import ATTEMPT_FILE, state_dir
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import Context
from ckpt_ha.storage import FsStore
from tests.support.bus_tools import wait_for
from tests.support.cli_tools import stack_env
from tests.support.resume_tools import bits, plan_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY, SEED = 60, 10, 5


@dataclass
class RunnerProcess:
    proc: asyncio.subprocess.Process
    home: Path
    job: str
    run_id: str
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    async def pump(self) -> None:
        async def read(stream: asyncio.StreamReader | None, into: list[str]) -> None:
            assert stream is not None
            async for line in stream:
                into.append(line.decode().rstrip("\n"))

        await asyncio.gather(
            read(self.proc.stdout, self.stdout), read(self.proc.stderr, self.stderr)
        )

    def child_pid(self, attempt: int) -> int | None:
        path = state_dir(self.home, self.job, self.run_id) / ATTEMPT_FILE
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text())
            if doc["attempt"] == attempt:
                return int(doc["handle"])
        return None

    def last_step(self) -> int:
        path = state_dir(self.home, self.job, self.run_id) / "progress"
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text())
        return 0

    def losses(self) -> dict[int, list[tuple[int, str]]]:
        """Per attempt: the (step, loss hex) lines the job printed."""
        out: dict[int, list[tuple[int, str]]] = {}
        for line in self.stdout:
            if line.startswith("{"):
                doc = json.loads(line)
                out.setdefault(doc["attempt"], []).append((doc["step"], doc["loss"]))
        return out


@dataclass
class Watch:
    """Events of one job seen live (a plain subscription, like a coordinator's view)."""

    failed: asyncio.Queue[JobFailedV1] = field(default_factory=asyncio.Queue)


@pytest.fixture
async def producer(settings: ServiceSettings) -> AsyncIterator[Bus]:
    bus = Bus(settings.bus(), "test-coordinator")
    await bus.broker.start()
    yield bus
    await bus.broker.stop()


@pytest.fixture
async def nc(settings: ServiceSettings) -> AsyncIterator[nats.NATS]:
    client = await nats.connect(settings.nats_url)
    yield client
    await client.close()


async def watch_failures(nc: nats.NATS, settings: ServiceSettings, job: str) -> Watch:
    watch = Watch()

    async def on_msg(msg: Msg) -> None:
        data = CATALOG.decode(msg.data).data
        assert isinstance(data, JobFailedV1)
        await watch.failed.put(data)

    await nc.subscribe(job_event_filter(settings.subject_prefix, "job.failed", job), cb=on_msg)
    await nc.flush()
    return watch


async def start_runner(
    settings: ServiceSettings, tmp_path: Path, job: str, *args: str, command: list[str]
) -> RunnerProcess:
    home, storage = tmp_path / "home", tmp_path / "storage"
    storage.mkdir(exist_ok=True)
    run_id = f"run-{job}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CKPT_HA_") and k not in ("NATS_URL", "REDIS_URL")
    }
    env.update(
        {
            "CKPT_HA_HOME": str(home),
            **stack_env(settings),
            "CKPT_HA_STORAGE_ROOT": str(storage),
            "CKPT_HA_CODE_VERSION": "test-code-1",
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ckpt_ha.cli.main",
        "run",
        "--job",
        job,
        "--run-id",
        run_id,
        *args,
        "--",
        *command,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return RunnerProcess(proc, home, job, run_id)


def example(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ckpt_ha.lab.examples.numpy_mlp",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--seed",
        str(SEED),
        *extra,
    ]


async def events_of(settings: ServiceSettings, job: str) -> list[EventData]:
    """The job's events and reports, merged by time."""
    subject = f"{settings.subject_prefix}.ev.*.*.*.{job_token(job)}"
    found, _ = await read_events(settings.bus(), CATALOG, subject, idle_timeout=2.0)
    return [e.data for e in found]


async def finish(runner: RunnerProcess, pump: asyncio.Task[None], timeout: float = 60) -> int:
    code = await asyncio.wait_for(runner.proc.wait(), timeout=timeout)
    await asyncio.wait_for(pump, timeout=10)
    return code


async def test_killed_job_is_relaunched_from_the_plan_and_continues_bit_for_bit(
    settings: ServiceSettings, producer: Bus, nc: nats.NATS, tmp_path: Path, unique: str
) -> None:
    job = f"mlp-{unique}"
    watch = await watch_failures(nc, settings, job)
    runner = await start_runner(
        settings, tmp_path, job, "--plan-timeout", "30", command=example("--sleep-per-step", "0.05")
    )
    pump = asyncio.create_task(runner.pump())

    # Let it train past a couple of checkpoints, then take the process away without warning.
    await wait_for(
        lambda: _true(runner.last_step() >= 25), timeout=60, what="the job to pass step 25"
    )
    pid = runner.child_pid(1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    failed = await asyncio.wait_for(watch.failed.get(), timeout=30)
    assert (failed.cause.value, failed.signal, failed.attempt) == ("node_exit", 9, 1)
    assert failed.last_step is not None
    assert failed.last_step >= 25
    assert failed.side.value == "infrastructure"

    # The coordinator's part: the newest valid checkpoint the job saved.
    storage = tmp_path / "storage"
    chosen, _ = latest_valid(FsStore(storage / job))
    assert chosen is not None
    restored_step = int(chosen.removeprefix("step-"))
    assert 20 <= restored_step <= failed.last_step
    plan = plan_for(storage, job, restored_step, attempt=2, failed_run_id=runner.run_id)
    await producer.publish(build(plan, source="test/coordinator", time=_now(), key=plan.plan_id))

    assert await finish(runner, pump) == 0, "\n".join(runner.stderr)

    # Bit for bit: the resumed attempt's losses are the uninterrupted run's.
    reference_root = tmp_path / "reference"
    reference_root.mkdir()
    cfg = numpy_mlp.Config(steps=STEPS, checkpoint_every=EVERY, seed=SEED)
    reference = numpy_mlp.train(cfg, Context(job, "ref", 1, str(reference_root), None))
    expected = {step: bits(loss) for step, loss in reference}
    per_attempt = runner.losses()
    resumed = per_attempt[2]
    assert [s for s, _ in resumed] == list(range(restored_step + 1, STEPS + 1))
    assert {s: bits(float.fromhex(h)) for s, h in resumed} == {
        s: b for s, b in expected.items() if s > restored_step
    }
    first = per_attempt[1]  # and the killed attempt had computed the same losses too
    assert {s: bits(float.fromhex(h)) for s, h in first} == {s: expected[s] for s, _ in first}

    # What the coordinator and the continuity check get to see.
    seen = await events_of(settings, job)
    kinds = [(d.EVENT_TYPE, getattr(d, "attempt", None)) for d in seen]
    assert kinds.count(("job.started", 1)) == 1
    assert kinds.count(("job.started", 2)) == 1
    assert ("job.succeeded", 2) in kinds
    started = [d for d in seen if isinstance(d, JobStartedV1)]
    assert started[1].plan_id == plan.plan_id
    assert started[1].restored_from == plan.checkpoint_id
    assert started[0].code_version == "test-code-1"
    loaded = [d for d in seen if isinstance(d, ResumeLoadedV1)]
    assert len(loaded) == 1
    assert loaded[0].step == restored_step
    progress = [d for d in seen if isinstance(d, JobProgressV1) and d.attempt == 2]
    assert progress[0].step == restored_step + 1
    assert {p.plan_id for p in progress} == {plan.plan_id}
    # The checkpoints record the environment the runner reported: a restore compares identical.
    saved = sdk.load(str(storage / job / chosen), tensors="numpy").manifest.identity
    assert saved is not None
    assert saved.environment == started[0].environment
    assert saved.topology == started[0].topology
    assert saved.code_version == "test-code-1"


async def test_an_escalation_stops_the_runner_with_exit_6(
    settings: ServiceSettings, producer: Bus, nc: nats.NATS, tmp_path: Path, unique: str
) -> None:
    job = f"loop-{unique}"
    watch = await watch_failures(nc, settings, job)
    runner = await start_runner(
        settings, tmp_path, job, "--plan-timeout", "30", command=example("--crash-at-step", "3")
    )
    pump = asyncio.create_task(runner.pump())
    failed = await asyncio.wait_for(watch.failed.get(), timeout=30)
    assert (failed.cause.value, failed.exit_code, failed.last_step) == ("error", 1, 2)
    assert failed.signature is not None
    escalated = ResumeEscalatedV2(
        job_id=job,
        plan_id=f"plan-{unique}",
        reason="restart loop: 3 restarts within 3600 s",
        next_step="docs/RUNBOOK.md#stop-runaway-retries: stop runaway retries",
    )
    await producer.publish(build(escalated, source="test/coordinator", time=_now(), key=unique))
    assert await finish(runner, pump) == 6
    err = "\n".join(runner.stderr)
    assert "escalated: restart loop: 3 restarts within 3600 s" in err
    assert "next step: docs/RUNBOOK.md#stop-runaway-retries: stop runaway retries" in err
    assert "crash requested at step 3" in err  # the job's own stderr came through


async def test_an_escalation_heard_while_the_attempt_exits_stops_the_runner(
    settings: ServiceSettings, producer: Bus, tmp_path: Path, unique: str
) -> None:
    """After a load failure the coordinator may escalate before the attempt has exited (its
    ``resume.load_failed`` goes out first): the runner must not drop that escalation and wait
    for a plan that never comes."""
    job = f"early-{unique}"
    slow_fail = [sys.executable, "-c", "import sys, time; time.sleep(3); sys.exit(1)"]
    runner = await start_runner(settings, tmp_path, job, "--plan-timeout", "30", command=slow_fail)
    pump = asyncio.create_task(runner.pump())

    async def started() -> list[EventData]:
        return [d for d in await events_of(settings, job) if isinstance(d, JobStartedV1)]

    await wait_for(started, what="job.started")
    escalated = ResumeEscalatedV2(
        job_id=job, plan_id=f"plan-{unique}", reason="attempt_cannot_load",
        next_step="docs/RUNBOOK.md#prepare-environment: prepare the restore environment",
        detail="attempt 2 could not load checkpoint c (it stays valid): no loader",
    )  # fmt: skip
    await producer.publish(build(escalated, source="test/coordinator", time=_now(), key=unique))
    assert await finish(runner, pump, timeout=20) == 6
    err = "\n".join(runner.stderr)
    assert "escalated: attempt_cannot_load" in err
    assert "why: attempt 2 could not load checkpoint c (it stays valid): no loader" in err
    assert f"every decision for this job: ckpt-ha restores --job {job}" in err


async def test_no_plan_in_time_exits_4(
    settings: ServiceSettings, tmp_path: Path, unique: str
) -> None:
    runner = await start_runner(
        settings,
        tmp_path,
        f"noplan-{unique}",
        "--plan-timeout",
        "0.5",
        command=[sys.executable, "-c", "import sys; sys.exit(2)"],
    )
    pump = asyncio.create_task(runner.pump())
    assert await finish(runner, pump) == 4
    assert any("no resume plan for attempt 2 within 0.5 s" in line for line in runner.stderr)


async def test_sigterm_to_the_runner_stops_the_attempt(
    settings: ServiceSettings, nc: nats.NATS, tmp_path: Path, unique: str
) -> None:
    job = f"stop-{unique}"
    watch = await watch_failures(nc, settings, job)
    runner = await start_runner(
        settings, tmp_path, job, command=example("--sleep-per-step", "0.2", "--steps", "1000")
    )
    pump = asyncio.create_task(runner.pump())
    await wait_for(lambda: _true(runner.last_step() >= 1), timeout=60, what="the first step")
    pid = runner.child_pid(1)
    assert pid is not None
    runner.proc.send_signal(signal.SIGTERM)
    assert await finish(runner, pump) == 128 + signal.SIGTERM
    failed = await asyncio.wait_for(watch.failed.get(), timeout=10)
    assert failed.cause.value == "preempted"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the training process is gone too


async def _true(value: bool) -> bool:
    return value


def _now() -> datetime:
    return datetime.now(UTC)


async def test_an_unreachable_bus_is_one_line_and_starts_nothing(
    settings: ServiceSettings, tmp_path: Path, unique: str
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    marker = tmp_path / "ran"
    runner = await start_runner(
        settings.model_copy(update={"nats_url": f"nats://127.0.0.1:{closed}"}),
        tmp_path,
        f"down-{unique}",
        command=[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"],
    )
    pump = asyncio.create_task(runner.pump())
    assert await finish(runner, pump, timeout=30) == Exit.UNREACHABLE  # 3: the exit-code table
    assert len(runner.stderr) == 1
    assert runner.stderr[0].startswith("ckpt-ha: cannot reach NATS at nats://127.0.0.1:")
    assert not marker.exists()


async def test_job_stop_stops_the_attempt_and_ends_the_run(
    settings: ServiceSettings, nc: nats.NATS, tmp_path: Path, unique: str
) -> None:
    from tests.support.cli_tools import cli

    job = f"opstop-{unique}"
    watch = await watch_failures(nc, settings, job)
    runner = await start_runner(
        settings, tmp_path, job, command=example("--sleep-per-step", "0.2", "--steps", "1000")
    )
    pump = asyncio.create_task(runner.pump())
    await wait_for(lambda: _true(runner.last_step() >= 1), timeout=60, what="the first step")
    pid = runner.child_pid(1)
    assert pid is not None
    rc, _, err = await cli(settings, tmp_path / "operator", "job", "stop", job,
                           "--actor", "carol", "--reason", "runaway")  # fmt: skip
    assert rc == 0, err
    assert await finish(runner, pump) == 5
    failed = await asyncio.wait_for(watch.failed.get(), timeout=10)
    assert (failed.cause.value, failed.detail) == (
        "cancelled",
        "stopped by carol (ckpt-ha job stop): runaway",
    )
    assert any("stop asked by carol: runaway" in line for line in runner.stderr)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the training process is gone too


async def test_a_plan_for_the_next_attempt_ends_the_running_one_and_is_carried_out(
    settings: ServiceSettings, producer: Bus, nc: nats.NATS, tmp_path: Path, unique: str
) -> None:
    """A chosen rollback (`ckpt-ha job restore --to`) of a running job: the coordinator plans
    the next attempt while this one runs; the runner ends it and relaunches from the plan."""
    job = f"rollback-{unique}"
    watch = await watch_failures(nc, settings, job)
    runner = await start_runner(
        settings, tmp_path, job, command=example("--sleep-per-step", "0.05", "--steps", "1000")
    )
    pump = asyncio.create_task(runner.pump())
    await wait_for(lambda: _true(runner.last_step() >= 25), timeout=60, what="step 25")
    plan = plan_for(tmp_path / "storage", job, 10, attempt=2, failed_run_id=runner.run_id)
    await producer.publish(build(plan, source="test/coordinator", time=_now(), key=plan.plan_id))
    failed = await asyncio.wait_for(watch.failed.get(), timeout=30)
    assert (failed.attempt, failed.cause.value) == (1, "preempted")
    assert failed.detail == f"ended for the rollback to {plan.checkpoint_id} (plan {plan.plan_id})"
    await wait_for(lambda: _true(2 in runner.losses()), timeout=60, what="attempt 2 training")
    assert runner.losses()[2][0][0] == 11  # resumed after the chosen step
    runner.proc.send_signal(signal.SIGTERM)
    await finish(runner, pump)
    assert any(f"rollback to {plan.checkpoint_id} planned: ending attempt 1" in line
               for line in runner.stderr)  # fmt: skip


async def test_an_escalation_of_the_running_attempts_plan_ends_it_and_the_run(
    settings: ServiceSettings, producer: Bus, nc: nats.NATS, tmp_path: Path, unique: str
) -> None:
    """Issue 28: the coordinator weighs a plan again for the attempt that loads it; when that
    attempt's shape cannot load it, the plan is stopped (``resume.escalated`` naming it). The
    runner ends the attempt carrying it out at once and the run ends escalated (exit 6)."""
    job = f"withdrawn-{unique}"
    watch = await watch_failures(nc, settings, job)
    runner = await start_runner(
        settings, tmp_path, job, "--plan-timeout", "30",
        command=example("--sleep-per-step", "0.1", "--steps", "1000"),
    )  # fmt: skip
    pump = asyncio.create_task(runner.pump())
    await wait_for(lambda: _true(runner.last_step() >= 12), timeout=60, what="step 12")
    pid = runner.child_pid(1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert (await asyncio.wait_for(watch.failed.get(), timeout=30)).attempt == 1
    plan = plan_for(tmp_path / "storage", job, 10, attempt=2, failed_run_id=runner.run_id)
    await producer.publish(build(plan, source="test/coordinator", time=_now(), key=plan.plan_id))
    await wait_for(lambda: _true(2 in runner.losses()), timeout=60, what="attempt 2 training")
    stop = ResumeEscalatedV2(
        job_id=job, plan_id=plan.plan_id, reason="compatibility_unknown", attempt=1,
        next_step="relaunch at world size 2", detail="re-planned for attempt 2: cannot reshard",
    )  # fmt: skip
    await producer.publish(build(stop, source="test/coordinator", time=_now(), key="stop"))
    failed = await asyncio.wait_for(watch.failed.get(), timeout=30)
    assert (failed.attempt, failed.cause.value) == (2, "preempted")
    assert failed.detail == f"ended: its plan {plan.plan_id} was stopped for its shape"
    assert await finish(runner, pump) == 6
    assert any(f"plan {plan.plan_id} stopped for attempt 2: ending it" in line
               for line in runner.stderr)  # fmt: skip
