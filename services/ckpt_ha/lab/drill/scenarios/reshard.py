"""Reshard: a 2-rank torchrun + DCP job loses its host (the runner and every rank SIGKILLed
together) and is taken over with ``ckpt-ha run --resume`` on 1 rank (a node gone, no spare).
The plan is decided for the failed attempt (2 ranks: exact); the attempt that loads it starts on
1 rank and the plan is re-stated for it ("reshard 2→1", issue 28): DCP loads the global state at
the new world size, and the run continues from exactly the restored step and data position."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from datetime import datetime
from typing import Any

from ckpt_ha.contracts.job import JobFailedV1, JobPolicy, Tolerance
from ckpt_ha.contracts.resume import ResumeLoadedV1, ResumePlannedV2
from ckpt_ha.lab.drill.assess import assess_restore, judged
from ckpt_ha.lab.drill.harness import Drill, progress_at_least, resumed_after, valid_count
from ckpt_ha.lab.drill.workloads import TAKEOVER_ONE_RANK, TORCHRUN_DCP

NAME = "reshard"
FAULT = "the host of a 2-rank torchrun DCP job is lost; the run is taken over on 1 rank"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""
REQUIRES = ("torch",)
"""Python packages the drill's job needs (the ``torch`` extra)."""
JOB_ARGS = ["--steps", "80", "--checkpoint-every", "10", "--sleep-per-step", "0.2"]
LIVENESS = ["--heartbeat-s", "1", "--deadline-s", "4"]
"""A lost host is declared after 4 s of silence (the coordinator looks every 5 s)."""
LOSS_REL = 1e-5
"""One rank's mean over the global batch and two ranks' average of their halves are the same
math summed in another order: float32 rounding, nothing more."""


def reshard_policy() -> JobPolicy:
    return JobPolicy(
        tier="drill",
        max_restarts=3,
        tolerances=(Tolerance(metric="loss", rel=LOSS_REL),),
        continuity_steps=3,
    )


def _lose_host(drill: Drill) -> list[int]:
    """SIGKILL the runner and every process of its attempt at once (the host is gone). The
    runner goes first: it watches the ranks, and a rank killed before it would be reported by
    it at once (a ``node_exit``, not the ``lost`` this drill is about) on a loaded machine."""
    top = drill.training_pid()
    pids = [*([drill.runner.pid] if drill.runner is not None else [])]
    pids += [*([top] if top is not None else []), *drill.rank_pids()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if drill.runner is not None:
        drill.runner.wait(timeout=10)
    drill.runner = None  # gone with its host: nothing to watch until the takeover
    return pids


async def run(drill: Drill) -> dict[str, Any]:
    """Two valid checkpoints, a few steps past the newest, then the host is lost. The
    coordinator declares the attempt lost (no heartbeat) and plans; a new runner takes the run
    over on 1 rank; the plan is re-stated for it; DCP reshards 2→1; continuity is verified."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with drill.session() as registry:
        drill.launch(reshard_policy(), JOB_ARGS, {}, TORCHRUN_DCP, ["--run-id", run_id, *LIVENESS])
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")
        await drill.until(lambda: _ranks(drill), "both ranks")
        pids = _lose_host(drill)
        fault = drill.fault(f"host lost: runner and ranks SIGKILLed (pids {pids})")
        await drill.until(lambda: _planned(drill, fault), "the attempt declared lost and planned")
        drill.launch(
            reshard_policy(), JOB_ARGS, {}, TAKEOVER_ONE_RANK,
            ["--run-id", run_id, "--resume", *LIVENESS],
        )  # fmt: skip
        drill.workload = TORCHRUN_DCP  # the baseline: the same job uninterrupted on 2 ranks
        drill.progress("taken over on 1 rank (ckpt-ha run --resume)")
        await drill.until(lambda: resumed_after(drill, fault), "the resume verdict", every=0.5)
        code = await drill.wait_exit()
        events = await drill.events()
    return _assess(drill, events, fault, code)


async def _ranks(drill: Drill) -> bool | None:
    return len(drill.rank_pids()) >= TORCHRUN_DCP.processes or None


async def _planned(drill: Drill, fault: datetime) -> bool | None:
    events = await drill.events()
    return any(isinstance(e.data, ResumePlannedV2) and e.time >= fault for e in events) or None


def _assess(drill: Drill, events: list[Any], fault: datetime, code: int) -> dict[str, Any]:
    phase = assess_restore(NAME, events, drill.job, fault)
    result = phase.to_json()
    after = [e for e in events if e.time >= fault]
    failures = [e.data for e in after if isinstance(e.data, JobFailedV1)]
    plans = [e.data for e in after if isinstance(e.data, ResumePlannedV2)]
    loads = [e.data for e in after if isinstance(e.data, ResumeLoadedV1)]
    first, final = (plans[0], plans[-1]) if plans else (None, None)
    loaded = loads[-1] if loads else None
    comparisons = result["levels"]["continued"]["evidence"].get("comparisons", [])
    result["reshard"] = {
        "failure": str(failures[0].__dict__.get("cause")) if failures else None,
        "planned_for_the_failed_attempt": first.mode.value if first else None,
        "restated_for_the_loader": final.mode.value if final else None,
        "reasons": list(final.reasons) if final else [],
        "loaded_world_size": loaded.world_size if loaded else None,
        "written_world_size": loaded.written_world_size if loaded else None,
        "loaded_step": loaded.step if loaded else None,
        "loaded_data_position": loaded.data_position if loaded else None,
    }
    result["job"], result["job_exit_code"] = drill.job, code
    said = " | ".join(final.reasons) if final else ""
    checks = {
        "the lost host was declared lost by the coordinator (one failure, cause lost)":
            len(failures) == 1 and str(failures[0].__dict__.get("cause")) == "lost",
        "the plan was re-stated for the attempt that loads it (same plan id, reshard 2→1)":
            first is not None and final is not None and len(plans) == 2
            and final.plan_id == first.plan_id and "reshard 2→1" in said,
        "its evidence says compatible, not exact": final is not None
            and final.mode.value == "compatible_resume",
        "every rank of the takeover (1) loaded the 2-rank checkpoint":
            loaded is not None and (loaded.world_size, loaded.written_world_size) == (1, 2),
        "the global state was restored exactly (step and data position of the checkpoint)":
            loaded is not None and final is not None and loaded.step == final.step
            and loaded.data_position == final.step,
        "the continuity verdict states the data position at world size 1 and the sampler order":
            any("at world size 1" in c["name"] for c in comparisons)
            and any("sampler's order carried over" in c["name"] and c["ok"]
                    for c in comparisons),
        "the job finished on 1 rank": code == 0,
    }  # fmt: skip
    return judged(result, checks, phases=phase.verdict == "pass")
