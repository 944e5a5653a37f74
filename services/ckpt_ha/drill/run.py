"""Fault drills against the embedded stack: run the example job under `ckpt-ha run`, inject one
fault, let the system restore it, and read back what happened from the event stream.

I/O lives here (processes, signals, NATS, Redis); what the evidence proves is decided in
`ckpt_ha.drill.assess`, purely.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG, Envelope, EventData
from ckpt_ha.contracts.job import JobPolicy, Tolerance
from ckpt_ha.contracts.subjects import job_token
from ckpt_ha.devstack import stack
from ckpt_ha.drill import assess
from ckpt_ha.drill.assess import Assessment, assess_restore
from ckpt_ha.registry.redis_registry import CheckpointRecord, Registry

T = TypeVar("T")

EXAMPLE = "ckpt_ha.examples.numpy_mlp"
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
    state: stack.StackState
    job: str
    budget_s: float
    log: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    runner: subprocess.Popen[bytes] | None = None
    runner_log: Path | None = None
    scenario: str = ""
    job_args: list[str] = field(default_factory=list)
    faults: list[tuple[str, datetime]] = field(default_factory=list)
    """Every fault injected, with the moment it took effect (the report marks them)."""

    # -- plumbing -------------------------------------------------------------------------

    def cfg(self) -> BusConfig:
        return BusConfig(url=self.state.nats_url)

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

    def fault(self, what: str) -> datetime:
        at = datetime.now(UTC)
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

    def launch(self, policy: JobPolicy, job_args: list[str], env: Mapping[str, str]) -> None:
        folder = self.home / "drills" / self.job
        folder.mkdir(parents=True, exist_ok=True)
        policy_file = folder / "policy.json"
        policy_file.write_text(policy.model_dump_json(indent=2))
        self.runner_log = folder / "runner.log"
        self.job_args = list(job_args)
        argv = [
            sys.executable, "-m", "ckpt_ha.cli.main", "run", "--job", self.job,
            "--policy", str(policy_file), "--plan-timeout", "60", "--",
            sys.executable, "-m", EXAMPLE, *job_args,
        ]  # fmt: skip
        full_env = {
            **os.environ,
            **env,
            "CKPT_HA_HOME": str(self.home),
            "NATS_URL": self.state.nats_url,
            "REDIS_URL": self.state.redis_url,
            "CKPT_HA_STORAGE_ROOT": self.state.storage_root,
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

    async def kill_training(self) -> datetime:
        pid = await self.until(lambda: _async(self.training_pid()), "the training process")
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


async def _async(value: T) -> T:
    return value


def _policy() -> JobPolicy:
    return JobPolicy(
        tier="drill",
        max_restarts=3,
        tolerances=(Tolerance(metric="loss"),),  # exact: the example job is deterministic
        continuity_steps=3,
    )


async def _valid_count(drill: Drill, registry: Registry, n: int) -> list[CheckpointRecord] | None:
    valid = [r for r in await drill.records(registry) if r.state.value == "valid"]
    return valid if len(valid) >= n else None


async def _progress_at_least(drill: Drill, step: int) -> bool | None:
    events = await drill.events()
    return (
        any(
            e.type.endswith("job.progress.v1") and (e.data.__dict__.get("step") or 0) >= step
            for e in events
        )
        or None
    )


async def _resumed_after(drill: Drill, fault: datetime) -> list[Envelope[EventData]] | None:
    events = await drill.events()
    done = [
        e
        for e in events
        if e.time >= fault and e.type.split(".")[1:3] in (["resume", "verified"],
                                                           ["resume", "diverged"])
    ]  # fmt: skip
    return done or None


async def node_exit(drill: Drill) -> dict[str, Any]:
    """SIGKILL the training process mid-training, and once more in the middle of writing a
    checkpoint; both times the system must restore the last valid checkpoint and continue."""
    registry = Registry.from_url(drill.state.redis_url)
    try:
        drill.launch(
            _policy(),
            ["--steps", "90", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--slow-save", "1.5"],
            {},
        )  # fmt: skip
        valid = await drill.until(lambda: _valid_count(drill, registry, 2), "two valid checkpoints")
        # A few steps past the newest checkpoint, so the resumed run recomputes steps the first
        # attempt reported: the continuity check compares them exactly.
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: _progress_at_least(drill, newest + 3), "training to go on")
        fault = await drill.kill_training()
        await drill.until(lambda: _resumed_after(drill, fault), "the first resume verdict")

        # Second fault: in the middle of a checkpoint write (writing announced, not committed).
        async def mid_write() -> bool | None:
            events = await drill.events()
            writing = {e.data.__dict__.get("checkpoint_id") for e in events
                       if e.type.endswith("checkpoint.writing.v1") and e.time > fault}  # fmt: skip
            done = {e.data.__dict__.get("checkpoint_id") for e in events
                    if e.type.endswith("checkpoint.committed.v1")}  # fmt: skip
            return bool(writing - done) or None

        await drill.until(mid_write, "a checkpoint being written", every=0.05)
        second = await drill.kill_training()
        await drill.until(lambda: _resumed_after(drill, second), "the second resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
    finally:
        drill.stop()
        await registry.close()
    first_phase = assess_restore("node-exit", [e for e in events if e.time < second], drill.job,
                                 fault)  # fmt: skip
    second_phase = assess_restore("node-exit/mid-write", events, drill.job, second)
    result = first_phase.to_json()
    result["phases"] = [first_phase.to_json(), second_phase.to_json()]
    result["job"] = drill.job
    result["job_exit_code"] = code
    ok = first_phase.verdict == second_phase.verdict == "pass" and code == 0
    result["verdict"] = "pass" if ok else "fail"
    if code != 0:
        result["reasons"].append(f"the job's runner exited {code}, see {drill.runner_log}")
    return result


def _newest_shard(storage_root: str, record: CheckpointRecord) -> Path:
    folder = Path(record.uri.removeprefix("file://"))
    if not folder.is_dir():
        raise DrillFailed(f"{record.uri} is not a local folder (the drill damages files by hand)")
    shards = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix == ".npy")
    if not shards:
        raise DrillFailed(f"no array shard in {record.uri}")
    return shards[-1]


async def corrupt_checkpoint(drill: Drill) -> dict[str, Any]:
    """The newest valid checkpoint is damaged on storage after it was registered; the job then
    dies. The restore must catch the damage at load, quarantine it, and fall back."""
    registry = Registry.from_url(drill.state.redis_url)
    try:
        drill.launch(_policy(), ["--steps", "60", "--checkpoint-every", "10",
                                 "--sleep-per-step", "0.05"], {})  # fmt: skip
        valid = await drill.until(lambda: _valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(valid, key=lambda r: r.step or 0)
        shard = _newest_shard(drill.state.storage_root, newest)
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF  # one flipped bit pattern, same size: only a checksum can tell
        shard.write_bytes(bytes(data))
        drill.fault(f"damaged {shard.name} of {newest.checkpoint_id} (step {newest.step})")
        fault = await drill.kill_training()
        await drill.until(lambda: _resumed_after(drill, fault), "a resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        damaged = await registry.get(newest.checkpoint_id)
    finally:
        drill.stop()
        await registry.close()
    phase = assess_restore("corrupt-checkpoint", events, drill.job, fault)
    result = phase.to_json()
    load_failed = [e for e in events if e.type.endswith("resume.load_failed.v1")
                   and e.data.__dict__.get("checkpoint_id") == newest.checkpoint_id]  # fmt: skip
    result["damaged_checkpoint"] = newest.checkpoint_id
    result["damaged_state"] = damaged.state.value if damaged else None
    result["load_failed"] = [{"event_id": e.id, "reason": e.data.__dict__.get("reason")}
                             for e in load_failed]  # fmt: skip
    result["job"], result["job_exit_code"] = drill.job, code
    checks = {
        "the damage was caught at load": bool(load_failed),
        "the damaged checkpoint is quarantined": bool(damaged and damaged.state.value
                                                      == "quarantined"),
        "the restore fell back to an older checkpoint": phase.restored_from not in
        (None, newest.checkpoint_id),
        "the job finished": code == 0,
    }  # fmt: skip
    result["checks"] = checks
    result["reasons"] += [f"not met: {what}" for what, ok in checks.items() if not ok]
    result["verdict"] = "pass" if phase.verdict == "pass" and all(checks.values()) else "fail"
    return result


async def _escalated(drill: Drill) -> list[Envelope[EventData]] | None:
    events = await drill.events()
    return [e for e in events if e.type.endswith("resume.escalated.v1")] or None


def _expect_escalation(
    scenario: str, drill: Drill, events: list[Envelope[EventData]], fault: datetime, code: int,
    reasons: set[str],
) -> dict[str, Any]:  # fmt: skip
    phase = assess_restore(scenario, events, drill.job, fault)
    result = phase.to_json()
    escalations = [e for e in events if e.type.endswith("resume.escalated.v1")]
    last = escalations[-1] if escalations else None
    after = [e for e in events if last is not None and e.time > last.time
             and e.type.endswith(("resume.planned.v1", "job.started.v1"))]  # fmt: skip
    result["escalation"] = (
        {"event_id": last.id, **last.data.model_dump(mode="json")} if last else None
    )
    result["job"], result["job_exit_code"] = drill.job, code
    checks = {
        "escalated": last is not None,
        f"for {' or '.join(sorted(reasons))}": last is not None
        and last.data.__dict__.get("reason") in reasons,
        "no restore or attempt after the escalation": not after,
        "the runner stopped (exit 3)": code == 3,
    }
    result["checks"] = checks
    result["reasons"] = [f"not met: {what}" for what, ok in checks.items() if not ok]
    result["verdict"] = "pass" if all(checks.values()) else "fail"
    return result


async def restart_loop(drill: Drill) -> dict[str, Any]:
    """The job crashes right after every resume: automatic retries must stop and escalate."""
    registry = Registry.from_url(drill.state.redis_url)
    try:
        drill.launch(
            JobPolicy(tier="drill", max_restarts=2, max_same_failure=3),
            ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--crash-after-resume"],
            {},
        )  # fmt: skip
        await drill.until(lambda: _valid_count(drill, registry, 1), "a valid checkpoint")
        fault = await drill.kill_training()
        await drill.until(lambda: _escalated(drill), "the escalation")
        code = await drill.wait_exit()
        await asyncio.sleep(1.0)  # anything that would still follow the escalation
        events = await drill.events()
    finally:
        drill.stop()
        await registry.close()
    return _expect_escalation(
        "restart-loop", drill, events, fault, code, {"restart_loop", "same_failure_repeating"}
    )


async def env_mismatch(drill: Drill) -> dict[str, Any]:
    """The checkpoints were written with another framework version than the restore target
    runs: compatibility is unknown, nothing is resumed automatically."""
    registry = Registry.from_url(drill.state.redis_url)
    try:
        drill.launch(
            JobPolicy(tier="drill"),
            ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--written-with-framework", "0.0.0-drill"],
            {},
        )  # fmt: skip
        await drill.until(lambda: _valid_count(drill, registry, 1), "a valid checkpoint")
        fault = await drill.kill_training()
        await drill.until(lambda: _escalated(drill), "the escalation")
        code = await drill.wait_exit()
        await asyncio.sleep(1.0)
        events = await drill.events()
    finally:
        drill.stop()
        await registry.close()
    return _expect_escalation("env-mismatch", drill, events, fault, code, {"compatibility_unknown"})


def _fs_root(storage_root: str) -> Path:
    if "://" in storage_root and not storage_root.startswith("file://"):
        raise DrillFailed(
            f"storage-outage takes a filesystem storage root away; this stack uses {storage_root}"
        )
    return Path(storage_root.removeprefix("file://"))


def _unmount(root: Path) -> Path:
    """Storage unavailable, as when its volume is unmounted: the root is moved away (the stores
    answer `StorageUnavailable` and create nothing in its place)."""
    away = root.with_name(f"{root.name}.outage")
    os.rename(root, away)
    return away


async def storage_outage(drill: Drill) -> dict[str, Any]:
    """Storage goes away twice: in the middle of a checkpoint write (the job trains on), and
    while the job is being restored after it died. No fake-complete checkpoint may appear, the
    interrupted write must be blamed on the infrastructure, the restore must wait for storage
    within its limits and resume from the last valid checkpoint, and the job must finish."""
    registry = Registry.from_url(drill.state.redis_url)
    root = _fs_root(drill.state.storage_root)
    away: Path | None = None
    outage_write, outage_restore = 8.0, 5.0  # the write's longer than the stall timeout (5 s)
    try:
        drill.launch(
            _policy(),
            ["--steps", "130", "--checkpoint-every", "10", "--sleep-per-step", "0.1",
             "--slow-save", "1.5"],
            {"CKPT_HA_RESTORE_STORAGE_WAIT_S": "30"},
        )  # fmt: skip
        valid = await drill.until(lambda: _valid_count(drill, registry, 1), "a valid checkpoint")
        since = datetime.now(UTC)

        async def mid_write() -> str | None:
            events = await drill.events()
            writing = [e.data.__dict__.get("checkpoint_id") for e in events
                       if e.type.endswith("checkpoint.writing.v1") and e.time > since]  # fmt: skip
            done = {e.data.__dict__.get("checkpoint_id") for e in events
                    if e.type.endswith("checkpoint.committed.v1")}  # fmt: skip
            pending = [c for c in writing if c not in done]
            return pending[-1] if pending else None

        hit = await drill.until(mid_write, "a checkpoint being written", every=0.05)
        away = _unmount(root)
        write_fault = drill.fault(f"storage unavailable for {outage_write:g} s during the write "
                                  f"of {hit}")  # fmt: skip
        await asyncio.sleep(outage_write)
        os.rename(away, root)
        away = None
        drill.progress("storage back")

        async def failed_write() -> list[Envelope[EventData]] | None:
            return [e for e in await drill.events() if e.type.endswith("checkpoint.write_failed.v1")
                    and e.data.__dict__.get("checkpoint_id") == hit] or None  # fmt: skip

        await drill.until(failed_write, "the interrupted write to be declared failed")
        before = len(await _valid_count(drill, registry, 1) or [])
        valid = await drill.until(lambda: _valid_count(drill, registry, before + 1),
                                  "a new valid checkpoint after the outage")  # fmt: skip
        # A few steps past it, so the resumed run recomputes steps the first attempt reported.
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: _progress_at_least(drill, newest + 3), "training to go on")
        restore_fault = await drill.kill_training()
        away = _unmount(root)
        drill.fault(f"storage unavailable for {outage_restore:g} s during the restore")
        await asyncio.sleep(outage_restore)
        os.rename(away, root)
        away = None
        back = datetime.now(UTC)
        drill.progress("storage back")
        await drill.until(lambda: _resumed_after(drill, restore_fault), "the resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        hit_record = await registry.get(hit)
        records = await drill.records(registry)
    finally:
        if away is not None:
            os.rename(away, root)
        drill.stop()
        await registry.close()
    write_phase = assess_restore("storage-outage/write", [e for e in events
                                 if e.time < restore_fault], drill.job, write_fault)  # fmt: skip
    restore_phase = assess_restore("storage-outage/restore", events, drill.job, restore_fault)
    mine = [e for e in events if e.data.job_id == drill.job]

    def about(kind: str, cid: str | None = None) -> list[Envelope[EventData]]:
        return [e for e in mine if e.type.endswith(kind)
                and (cid is None or e.data.__dict__.get("checkpoint_id") == cid)]  # fmt: skip

    write_failed = about("checkpoint.write_failed.v1", hit)
    faked = about("checkpoint.committed.v1", hit) + about("checkpoint.registered.v1", hit)
    failed_jobs = [e for e in about("job.failed.v1") if write_fault <= e.time < restore_fault]
    loaded = [e for e in about("resume.loaded.v1") if e.time >= restore_fault]
    load_failed = [e for e in about("resume.load_failed.v1") if e.time >= restore_fault]
    quarantined = about("checkpoint.quarantined.v1")
    progress_during = [
        e
        for e in about("job.progress.v1")
        if write_fault <= e.time < write_fault + timedelta(seconds=outage_write)
    ]
    last_valid = restore_phase.last_valid_checkpoint
    result = {**restore_phase.to_json(), "scenario": "storage-outage"}
    result["phases"] = [write_phase.to_json(), restore_phase.to_json()]
    # The write phase has no restore: its levels are about the restore after the second outage.
    result["phases"][0]["verdict"] = "n/a"
    result["interrupted_write"] = {
        "checkpoint_id": hit,
        "state": hit_record.state.value if hit_record else None,
        "write_failed": [{"event_id": e.id, "side": str(e.data.__dict__.get("side")),
                          "reason": e.data.__dict__.get("reason")} for e in write_failed],
        "committed_or_registered": [e.id for e in faked],
    }  # fmt: skip
    result["restore_wait"] = {
        "storage_back": back.isoformat(),
        "loaded": [{"event_id": e.id, "time": e.time.isoformat(), "checkpoint_id":
                    e.data.__dict__.get("checkpoint_id")} for e in loaded],
        "load_failed": [e.id for e in load_failed],
        "quarantined": [e.data.__dict__.get("checkpoint_id") for e in quarantined],
    }  # fmt: skip
    result["valid_checkpoints"] = sorted(r.step or 0 for r in records if r.state.value == "valid")
    result["job"], result["job_exit_code"] = drill.job, code
    side_ok = any(
        w["side"] == "infrastructure" for w in result["interrupted_write"]["write_failed"]
    )
    checks = {
        "no fake-complete checkpoint: the interrupted write was never committed or registered":
            not faked and (hit_record is None or hit_record.state.value != "valid"),
        "the interrupted write was declared failed on the infrastructure side": side_ok,
        "the job trained on through the write outage (no failure, progress reported)":
            not failed_jobs and bool(progress_during),
        "the restore waited for storage and loaded after it came back":
            bool(loaded) and loaded[0].time >= back and not load_failed,
        "the restore used the last valid checkpoint": restore_phase.restored_from == last_valid,
        "no checkpoint was quarantined because of the outage": not quarantined,
        "the job finished": code == 0,
    }  # fmt: skip
    result["checks"] = checks
    result["reasons"] += [f"not met: {what}" for what, ok in checks.items() if not ok]
    ok = restore_phase.verdict == "pass" and all(checks.values())
    result["verdict"] = "pass" if ok else "fail"
    return result


SCENARIOS: dict[str, Callable[[Drill], Coroutine[Any, Any, dict[str, Any]]]] = {
    "node-exit": node_exit,
    "storage-outage": storage_outage,
    "corrupt-checkpoint": corrupt_checkpoint,
    "restart-loop": restart_loop,
    "env-mismatch": env_mismatch,
}


FAULTS = {
    "node-exit": "the training process is SIGKILLed, once mid-training and once mid-write",
    "storage-outage": "the storage root is unavailable during a checkpoint write and a restore",
    "corrupt-checkpoint": "the newest valid checkpoint's bytes are damaged on storage",
    "restart-loop": "the job crashes right after every resume",
    "env-mismatch": "the checkpoints record another framework version than the restore target",
}
"""The one variable each drill changes; everything else is the baseline."""


def baseline(job_args: Sequence[str]) -> dict[str, Any]:
    """What every drill keeps fixed: model, data, config, environment and resources."""
    import numpy as np

    from ckpt_ha.examples import numpy_mlp

    cfg, _ = numpy_mlp.parse(list(job_args))
    return {
        "model": f"{EXAMPLE}: MLP {numpy_mlp.FEATURES}-{numpy_mlp.HIDDEN}-1 (tanh, dropout "
        f"{cfg.dropout}), Adam, warm-up then cosine LR",
        "data": f"synthetic regression set, {numpy_mlp.SAMPLES} x {numpy_mlp.FEATURES}, "
        f"dataset seed {numpy_mlp.DATASET_SEED}, batch {cfg.batch_size}",
        "config": dataclasses.asdict(cfg),
        "job_args": list(job_args),
        "environment": {"python": platform.python_version(), "numpy": np.__version__,
                        "platform": platform.platform()},
        "resources": {"cpus": os.cpu_count(), "processes": 1, "gpus": 0},
    }  # fmt: skip


def baseline_losses(job_args: Sequence[str]) -> list[list[float]]:
    """The uninterrupted run of the same job with the same seed, in-process: (step, loss)."""
    from ckpt_ha import sdk
    from ckpt_ha.examples import numpy_mlp

    cfg, _ = numpy_mlp.parse(list(job_args))
    # Checkpoints, sleeps and crashes change no loss: the reference run does without them.
    cfg = dataclasses.replace(
        cfg, checkpoint_every=cfg.steps + 1, sleep_per_step=0.0, slow_save=0.0,
        crash_at_step=None, crash_after_resume=False,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(io.StringIO()):
        losses = numpy_mlp.train(cfg, sdk.Context("baseline", "baseline", 1, root, None))
    return [[step, loss] for step, loss in losses]


def drill_losses(runner_log: Path | None) -> list[list[float]]:
    """(step, loss, attempt) of every step the drill's job printed, in order."""
    out: list[list[float]] = []
    if runner_log is None or not runner_log.exists():
        return out
    for line in runner_log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
            out.append([int(doc["step"]), float.fromhex(doc["loss"]), int(doc["attempt"])])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def metrics_after(state: stack.StackState, job: str) -> dict[str, float]:
    """The job's series on every service's /metrics once the drill ended (what a dashboard or an
    alert sees), plus each service's dead-letter total. Unreachable services are skipped."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for proc in state.processes:
        if not proc.http_port:
            continue
        try:
            with urlopen(f"http://127.0.0.1:{proc.http_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("job_id") == job:
                    extra = ",".join(
                        f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("job_id",)
                    )
                    out[f"{sample.name}{{{extra}}}"] = sample.value
                elif sample.name == "ckpt_ha_dead_letters_total":
                    key = f"{sample.name}{{service={labels.get('service', proc.name)}}}"
                    out[key] = out.get(key, 0.0) + sample.value
    return dict(sorted(out.items()))


EXPECTED_ALERTS = {"corrupt-checkpoint": "CheckpointCorrupt", "restart-loop": "RestartLoop"}
"""The page each scenario must raise (checked when the stack runs Prometheus)."""


def alerts_fired(state: stack.StackState, job: str, expected: str | None) -> dict[str, Any]:
    """Which of the shipped alerts fired (or are pending) for the job, as the stack's Prometheus
    evaluated them. Waits a few evaluation rounds (longer for an alert the scenario expects)."""
    import urllib.parse
    from urllib.request import urlopen

    prom = next((p for p in state.processes if p.name == "prometheus"), None)
    if prom is None:
        return {
            "available": False,
            "alerts": {},
            "why": "this stack runs no Prometheus (run scripts/observability-tools, then "
            "`ckpt-ha down` / `up`)",
        }
    query = (
        f'max by (alertname, alertstate, severity) (max_over_time(ALERTS{{job_id="{job}"}}[1h]))'
    )
    url = f"{prom.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    deadline = time.monotonic() + (30.0 if expected else 6.0)
    alerts: dict[str, dict[str, str]] = {}
    while True:
        try:
            with urlopen(url, timeout=5) as resp:  # noqa: S310 - the stack's own Prometheus
                doc = json.loads(resp.read())
        except OSError as exc:
            return {"available": False, "alerts": {}, "why": f"Prometheus unreachable: {exc}"}
        for item in doc.get("data", {}).get("result", []):
            m = item["metric"]
            name = m.get("alertname", "?")
            if alerts.get(name, {}).get("state") != "firing":  # firing wins over pending
                alerts[name] = {
                    "state": m.get("alertstate", "?"),
                    "severity": m.get("severity", "?"),
                }
        done = expected is None or alerts.get(expected, {}).get("state") == "firing"
        if done or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return {"available": True, "alerts": alerts, "prometheus": prom.url}


def _run_one(scenario: str, home: Path, state: stack.StackState, log: Callable[[str], None],
             budget_s: float, number: str) -> dict[str, Any]:  # fmt: skip
    job = f"drill-{scenario}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    drill = Drill(home=home, state=state, job=job, budget_s=budget_s, log=log,
                  scenario=f"{number}{scenario}")  # fmt: skip
    drill.progress(f"job {job}: {FAULTS[scenario]}")
    try:
        result = asyncio.run(SCENARIOS[scenario](drill))
    except DrillFailed as exc:
        result = {
            "scenario": scenario,
            "verdict": "fail",
            "stopped": True,
            "job": job,
            "reasons": [f"stopped: {exc}"],
            "levels": {},
            "last_valid_checkpoint": None,
            "restored_from": None,
            "continue_step": None,
            "recompute_steps": None,
            "timeline": [],
        }
    events = asyncio.run(drill.events())
    result["baseline"] = baseline(drill.job_args)
    result["fault"] = FAULTS[scenario]
    result["elapsed_seconds"] = round(time.monotonic() - drill.started, 2)
    result["curves"] = {
        "baseline": baseline_losses(drill.job_args) if drill.job_args else [],
        "drill": drill_losses(drill.runner_log),
    }
    result["marks"] = assess.marks(events, job, drill.faults)
    result["resources_reclaimed"] = assess.reclaimed(events, job)
    result["manual_actions"] = assess.manual_actions(events, job)
    result["metrics_after"] = metrics_after(state, job)
    result["alerts_fired"] = alerts_fired(state, job, EXPECTED_ALERTS.get(scenario))
    expected = EXPECTED_ALERTS.get(scenario)
    if expected is not None and result["alerts_fired"]["available"]:
        fired = result["alerts_fired"]["alerts"]
        alerted = fired.get(expected, {}).get("state") == "firing"
        result.setdefault("checks", {})[f"alerted ({expected})"] = alerted
        if not alerted:
            result["verdict"] = "fail"
            result.setdefault("reasons", []).append(f"not met: alerted ({expected})")
    drill.progress(f"{result['verdict'].upper()} in {result['elapsed_seconds']:.0f}s")
    return result


def run(scenario: str, home: Path, env: Mapping[str, str], log: Callable[[str], None],
        budget_s: float = 300.0) -> dict[str, Any] | list[dict[str, Any]]:  # fmt: skip
    """Start the embedded stack if none runs, run one scenario (its JSON result) or ``all`` of
    them in turn on that stack (a list of results). ``budget_s`` bounds each drill."""
    state = stack.StackState.load(home)
    if state is None or not all(s.alive for s in stack.status(state)):
        log(f"starting the embedded stack under {home}")
        state = stack.up(home, {**env, **DRILL_ENV})
    if scenario != "all":
        return _run_one(scenario, home, state, log, budget_s, "")
    names = list(SCENARIOS)
    return [
        _run_one(name, home, state, log, budget_s, f"{i}/{len(names)} ")
        for i, name in enumerate(names, 1)
    ]


def as_json(result: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(result, indent=2, default=str)


def as_text(result: Mapping[str, Any]) -> str:
    """The drill's story for a person: timeline, then the five levels and the verdict."""
    lines = [f"drill {result['scenario']} on job {result.get('job')}: {result['verdict'].upper()}"]
    for phase in result.get("phases") or [result]:
        lines.append("")
        lines.append(f"-- {phase['scenario']}")
        for t in phase.get("timeline", []):
            at = t["t_seconds"]
            when = f"{at:+9.2f}s" if at is not None else " " * 10
            lines.append(f"  {when}  {t['what']}")
        lines.append(f"  last valid checkpoint: {phase.get('last_valid_checkpoint')}")
        lines.append(f"  restored from:         {phase.get('restored_from')}")
        lines.append(f"  continue step:         {phase.get('continue_step')}")
        lines.append(f"  recompute steps:       {phase.get('recompute_steps')}")
        if phase.get("durations"):
            d = phase["durations"]
            lines.append(
                f"  fault → resume.verified {d['total']:.2f}s: control plane "
                f"{d['control_plane']:.2f}s ({100 * d['control_plane_share']:.0f}%: detect "
                f"{d['detect']:.2f}, plan {d['plan']:.3f}, relaunch {d['relaunch']:.2f}, verdict "
                f"{d['verdict']:.3f}), job {d['load'] + d['compute']:.2f}s (load {d['load']:.2f},"
                f" compute {d['compute']:.2f})"
            )
        for name, level in (phase.get("levels") or {}).items():
            mark = "PASS" if level["passed"] else "FAIL"
            evidence = json.dumps(level["evidence"], default=str)[:150]
            lines.append(f"  {mark}  {name:<10} {evidence}")
    fired = result.get("alerts_fired") or {}
    if fired.get("available"):
        alerts = fired["alerts"].items()
        names = ", ".join(f"{n} ({a['state']}, {a['severity']})" for n, a in alerts)
        lines.append(f"alerts for the job: {names or 'none'}")
    elif fired:
        lines.append(f"alerts: not recorded ({fired.get('why')})")
    if "manual_actions" in result:
        lines.append(f"manual actions: {len(result['manual_actions']) or 'none'}")
    lines.extend(f"reason: {reason}" for reason in result.get("reasons", []))
    return "\n".join(lines)


__all__ = ["SCENARIOS", "Assessment", "run"]
