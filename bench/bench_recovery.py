"""Time to recover (issue 28): for a crash, a lost host and a hang of the 2-rank torchrun + DCP
job, from the fault to the first training step after the restore, split into detection, plan,
relaunch (process start and imports), load and first step. Side by side in one run, on one
private embedded stack (default timings: heartbeats every 10 s, no per-job deadline or hang
threshold).

* crash: the ``torchrun-dcp`` drill's first fault (rank 1 SIGKILLed mid-training);
* hang: the ``hang`` drill (rank 1 sleeps inside training, processes alive);
* lost host: the runner and every training process SIGKILLed together (no ``job.failed``), the
  run taken over by ``ckpt-ha run --resume`` started right away, as a scheduler's resubmission
  would; detection is the coordinator's ``job.failed`` cause ``lost``.

    PYTHONPATH=services:contracts:. .venv/bin/python bench/bench_recovery.py [--rounds N]
        [--case crash|hang|lost] [--home DIR]
    ... bench/bench_recovery.py --soak 30 [--seed S]   (false hang detections, see below)

A crash's detection is split further into **seen** (the fault → the runner saw the rank's end:
its own rank watch while torchrun runs, or torchrun's exit; its "a rank failed (...; seen at
T)" line) and **report** (→ ``job.failed``).

``--soak MINUTES``: instead, `soak_job.py` (low CPU: short steps with jitter, slow evaluations
marked with ``sdk.slow_phase``, slow saves) under ``ckpt-ha run`` for MINUTES at the default
hang detection; prints the ``job.failed`` causes (every ``hang`` is a false detection).

The first step after the restore is the resumed attempt's first ``job.progress`` (its time
minus ``resume.loaded``'s); plan is ``resume.planned`` minus ``job.failed``; relaunch is the new
attempt's ``job.started`` minus the plan (for a takeover: the plan is published while the new
runner already waits). Targets: crash detection + plan < 1 s; lost host detected < 60 s; hang
detected within max(10 x median step interval, 60 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckpt_ha.contracts.job import JobFailedV1, JobProgressV1, JobStartedV1
from ckpt_ha.contracts.resume import ResumeLoadedV1, ResumePlannedV2
from ckpt_ha.lab.devstack import stack
from ckpt_ha.lab.drill import run as drills
from ckpt_ha.lab.drill.harness import DRILL_ENV, Drill, policy, resumed_after, valid_count
from ckpt_ha.lab.drill.workloads import TORCHRUN_DCP, Workload
from ckpt_ha.runner.adapter import process_tree, signal_all
from ckpt_ha.runtime import local_stack

PARTS = ("detect", "plan", "relaunch", "load", "first_step")


def split(events: list[Any], job: str, fault: datetime) -> dict[str, float] | None:
    """Seconds of each part of the first recovery after ``fault`` (None: it did not happen)."""
    mine = [e for e in events if e.data.job_id == job and e.time >= fault]

    def first(kind: type, when: Any = lambda e: True) -> Any:
        return next((e for e in mine if isinstance(e.data, kind) and when(e)), None)

    failed = first(JobFailedV1)
    plan = first(ResumePlannedV2)
    if failed is None or plan is None:
        return None
    started = first(JobStartedV1, lambda e: e.data.plan_id == plan.data.plan_id)
    loaded = first(ResumeLoadedV1, lambda e: e.data.plan_id == plan.data.plan_id)
    if started is None or loaded is None:
        return None
    step = first(JobProgressV1, lambda e: e.data.attempt == started.data.attempt)
    if step is None:
        return None
    parts = {
        "detect": (failed.time - fault).total_seconds(),
        "plan": (plan.time - failed.time).total_seconds(),
        "relaunch": (started.time - max(plan.time, fault)).total_seconds(),
        "load": (loaded.time - started.time).total_seconds(),
        "first_step": (step.time - loaded.time).total_seconds(),
    }
    parts["total"] = (step.time - fault).total_seconds()
    parts["cause"] = str(failed.data.__dict__.get("cause"))
    return parts


def drill_case(home: Path, scenario: str) -> tuple[dict[str, float] | None, dict[str, Any]]:
    result = drills.run(scenario, home, dict(os.environ), lambda _: None, budget_s=400.0)
    assert isinstance(result, dict)
    events = asyncio.run(_events(home, result["job"]))
    fault = _first_fault(result)
    parts = split(events, result["job"], fault) if fault else None
    seen, watched = _seen_by_runner(home / "drills" / result["job"] / "runner.log")
    if parts is not None and fault is not None and seen is not None:
        # detect = seen (fault → the runner saw the rank's end: its own watch, or torchrun
        # ending the group and exiting) + report (→ job.failed published).
        parts["seen"] = (seen - fault).total_seconds()
        parts["report"] = parts["detect"] - parts["seen"]
        parts["watched"] = float(watched)
    return parts, result


def _seen_by_runner(log: Path) -> tuple[datetime | None, bool]:
    """When the runner saw the first failed rank (its "a rank failed (...; seen at T)" line),
    and whether its own watch saw it (torchrun still running) rather than torchrun's exit."""
    if not log.exists():
        return None, False
    for line in log.read_text(errors="replace").splitlines():
        if "a rank failed (" in line and "seen at " in line:
            at = datetime.fromisoformat(line.rsplit("seen at ", 1)[1].rstrip(")"))
            return at, "torchrun still runs" in line
    return None, False


def _first_fault(result: dict[str, Any]) -> datetime | None:
    marks = result.get("marks", {}).get("faults") or []
    return datetime.fromisoformat(marks[0]["time"]) if marks else None


async def _events(home: Path, job: str) -> list[Any]:
    state = local_stack.StackState.load(home)
    assert state is not None
    drill = Drill(home=home, state=state, job=job, budget_s=60, log=lambda _: None,
                  scenario="bench")  # fmt: skip
    return await drill.events()


async def lost_host(home: Path) -> tuple[dict[str, float] | None, dict[str, Any]]:
    """SIGKILL the runner and the training together, then take the run over at once."""
    state = local_stack.StackState.load(home)
    assert state is not None
    job = f"bench-lost-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    drill = Drill(home=home, state=state, job=job, budget_s=400, log=print, scenario="lost-host")
    registry = drill.registry()
    args = ["--steps", "4000", "--checkpoint-every", "10", "--sleep-per-step", "0.05"]
    try:
        drill.launch(policy(), args, {}, TORCHRUN_DCP)
        await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        assert drill.runner is not None
        # The whole host at once: the runner, torchrun and each rank (every rank runs in a
        # session of its own, so the tree is collected first).
        tree = process_tree(drill.runner.pid)
        signal_all(tree, signal.SIGKILL)
        fault = drill.fault("runner and training SIGKILLed together (the host is gone)")
        drill.runner.wait(timeout=10)
        attempt_file = next((home / "runs").glob(f"*{job}*/*/attempt.json"))
        run_id = json.loads(attempt_file.read_text())["run_id"]
        takeover = ["--run-id", run_id, "--resume", "--plan-timeout", "120"]
        drill.launch(policy(), args, {}, TORCHRUN_DCP, runner_args=takeover)
        await drill.until(lambda: resumed_after(drill, fault), "the takeover's resume verdict")
        events = await drill.events()
    finally:
        if drill.runner is not None:
            signal_all(process_tree(drill.runner.pid), signal.SIGKILL)
        drill.stop()
        await registry.close()
    return split(events, job, fault), {"job": job, "run_id": run_id}


SOAK_JOB = Path(__file__).with_name("soak_job.py")


async def soak(home: Path, minutes: float, seed: int) -> dict[str, Any]:
    """The low-CPU job (`soak_job.py`) under `ckpt-ha run` for ``minutes`` at the default hang
    detection: count the attempts declared hung (every one is a false detection)."""
    state = local_stack.StackState.load(home)
    assert state is not None
    job = f"bench-soak-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    budget = minutes * 60 + 600
    drill = Drill(home=home, state=state, job=job, budget_s=budget, log=print, scenario="soak")
    until = datetime.now(UTC).timestamp() + minutes * 60
    workload = Workload(
        name="soak",
        argv=lambda a: [sys.executable, str(SOAK_JOB), *a],
        baseline=lambda a: {},
        baseline_losses=lambda a: [],
    )
    try:
        drill.launch(policy(), ["--until", str(until), "--seed", str(seed)], {}, workload)
        assert drill.runner is not None
        while drill.runner.poll() is None:
            drill.remaining()
            await asyncio.sleep(5)
        events = await drill.events()
    finally:
        if drill.runner is not None and drill.runner.poll() is None:
            signal_all(process_tree(drill.runner.pid), signal.SIGKILL)
        drill.stop()
    failed = [e for e in events if isinstance(e.data, JobFailedV1)]
    causes = [str(e.data.__dict__.get("cause")) for e in failed]
    steps = [e for e in events if isinstance(e.data, JobProgressV1)]
    phases = [json.loads(line) for line in _job_lines(drill.runner_log)]
    return {
        "job": job,
        "minutes": minutes,
        "runner_exit": drill.runner.returncode if drill.runner else None,
        "false_hang_detections": causes.count("hang"),
        "job_failed_causes": causes,
        "progress_events": len(steps),
        "evals_s": [p["seconds"] for p in phases if p.get("event") == "eval"],
        "saves_s": [p["seconds"] for p in phases if p.get("event") == "save"],
        "attempts": sorted({p["attempt"] for p in phases if p.get("event") == "start"}),
    }


def _job_lines(log: Path | None) -> list[str]:
    if log is None or not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if line.startswith('{"t": ')]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.add_argument("--case", choices=("all", "crash", "hang", "lost"), default="all")
    p.add_argument("--soak", type=float, metavar="MINUTES",
                   help="instead: the false-hang soak, `soak_job.py` for MINUTES")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--home", type=Path, help="the stack's home (kept): default a temporary one")
    args = p.parse_args()
    rows: list[tuple[str, dict[str, float] | None]] = []
    extra: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or Path(tmp) / "home"
        env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
        env["CKPT_HA_HOME"] = str(home)
        os.environ.pop("NATS_URL", None)
        os.environ.pop("REDIS_URL", None)
        os.environ["CKPT_HA_HOME"] = str(home)
        stack.up(home, {**env, **DRILL_ENV}, storage_link=True)
        try:
            if args.soak is not None:
                print(json.dumps(asyncio.run(soak(home, args.soak, args.seed)), indent=2))
                return 0
            for _ in range(args.rounds):
                if args.case in ("all", "crash"):
                    crash, result = drill_case(home, "torchrun-dcp")
                    rows.append(("crash (rank SIGKILL)", crash))
                if args.case in ("all", "hang"):
                    hang, result = drill_case(home, "hang")
                    rows.append(("hang (rank sleeps)", hang))
                    extra.append({"hang": result.get("hang"), "verdict": result.get("verdict")})
                if args.case in ("all", "lost"):
                    lost, info = asyncio.run(lost_host(home))
                    rows.append(("lost host (takeover)", lost))
                    extra.append(info)
        finally:
            subprocess.run([sys.executable, "-m", "ckpt_ha.cli.main", "down"], env=env,
                           check=False)  # fmt: skip
    if args.json:
        print(json.dumps({"rows": rows, "extra": extra}, indent=2, default=str))
    print(f"{'case':<24} " + " ".join(f"{p:>10}" for p in (*PARTS, "total")) + "  cause")
    for name, parts in rows:
        if parts is None:
            print(f"{name:<24} did not recover (see the drill output)")
            continue
        cells = " ".join(f"{parts[k]:10.2f}" for k in (*PARTS, "total"))
        print(f"{name:<24} {cells}  {parts['cause']}")
        if "seen" in parts:
            how = "the runner's rank watch" if parts["watched"] else "torchrun's exit"
            print(f"{'':<24} detect = seen {parts['seen']:.3f} ({how}) + report "
                  f"{parts['report']:.3f} (→ job.failed)")  # fmt: skip
    for name in {n for n, _ in rows}:
        totals = [r["detect"] for n, r in rows if n == name and r]
        if len(totals) > 1:
            print(f"{name}: detection median {statistics.median(totals):.2f} s")
    print(json.dumps(extra, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
