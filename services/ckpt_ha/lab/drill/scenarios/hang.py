"""Hang: one rank of a 2-rank torchrun job stops inside training and sleeps, its processes
alive; the other waits for it in a collective. Nothing crashes, nothing exits: only the
runner's hang detection (issue 28) ends it."""

from __future__ import annotations

import contextlib
import os
from datetime import datetime
from typing import Any

from ckpt_ha.contracts.job import JobFailedV3
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.lab.drill.assess import assess_restore, judged
from ckpt_ha.lab.drill.harness import Drill, policy, resumed_after, valid_count
from ckpt_ha.lab.drill.workloads import TORCHRUN_DCP

NAME = "hang"
FAULT = "one rank of a 2-rank torchrun job sleeps inside training (processes alive)"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""
REQUIRES = ("torch",)
"""Python packages the drill's job needs (the ``torch`` extra)."""
HANG_RANK, HANG_AT = 1, 30
BOUND_FLOOR_S = 60.0
"""Detection must come within max(10 x the median step interval, 60 s) (issue 28); the
example's steps take well under 6 s, so the floor is the bound."""
STOP_SLACK_S = 15.0
"""For stopping the group (SIGTERM, SIGKILL after 10 s) and reporting, on a loaded machine."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        if stat.read().rsplit(")", 1)[-1].split()[0] == "Z":
            return False  # a zombie: gone, not yet reaped
    return True


async def run(drill: Drill) -> dict[str, Any]:
    """Rank 1 sleeps at step 30 of the first attempt (after the step's collectives, before
    marking it); rank 0 reports step 30 and waits for rank 1 inside the collective save of
    step 30 (a slow phase, which must not hide the stall). The runner must see the progress
    stop (the job's steps, ~0.3 s, give the 30 s floor), stop the whole group, report ``hang``
    naming rank 1 and step 29, and the relaunch resume from the newest valid checkpoint,
    continuing exactly."""
    async with drill.session() as registry:
        drill.launch(
            policy(),
            ["--steps", "40", "--checkpoint-every", "10", "--sleep-per-step", "0.25",
             "--hang-rank", str(HANG_RANK), "--hang-at-step", str(HANG_AT)],
            {},
            TORCHRUN_DCP,
        )  # fmt: skip
        await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")

        async def hanging() -> list[int] | None:
            text = drill.runner_log.read_text(errors="replace") if drill.runner_log else ""
            return drill.rank_pids() if f"hanging at step {HANG_AT}" in text else None

        hung_pids = await drill.until(hanging, f"rank {HANG_RANK} to hang at step {HANG_AT}")
        fault = drill.fault(f"rank {HANG_RANK} sleeps at step {HANG_AT} (pids {hung_pids})")
        await drill.until(lambda: resumed_after(drill, fault), "the resume verdict", every=0.5)
        survivors = [pid for pid in hung_pids if _alive(pid)]
        code = await drill.wait_exit()
        events = await drill.events()
    return _assess(drill, events, fault, survivors, code)


def _assess(
    drill: Drill, events: list[Any], fault: datetime, survivors: list[int], code: int
) -> dict[str, Any]:
    phase = assess_restore(NAME, events, drill.job, fault)
    result = phase.to_json()
    hangs = [e for e in events if isinstance(e.data, JobFailedV3) and e.data.cause == "hang"]
    failures = [e for e in events if ".job.failed.v" in e.type]
    plans = [e.data for e in events if isinstance(e.data, ResumePlannedV2) and e.time >= fault]
    hang = hangs[0].data if hangs else None
    detected_s = (hangs[0].time - fault).total_seconds() if hangs else None
    result["hang"] = {
        "detected_after_s": detected_s,
        "threshold_s": hang.hang_after_s if hang else None,
        "stalled_ranks": list(hang.stalled_ranks) if hang else None,
        "last_step": hang.last_step if hang else None,
        "detail": hang.detail if hang else None,
        "survivors": survivors,
    }
    result["job"], result["job_exit_code"] = drill.job, code
    checks = {
        "one failure, reported as a hang": len(failures) == 1 and hang is not None,
        f"it names rank {HANG_RANK} as the rank that stopped first":
            hang is not None and hang.stalled_ranks[:1] == (HANG_RANK,),
        f"it names the last step every rank reached ({HANG_AT - 1})":
            hang is not None and hang.last_step == HANG_AT - 1,
        "detected within max(10 x median step, 60 s)":
            detected_s is not None and detected_s <= BOUND_FLOOR_S + STOP_SLACK_S,
        "every process of the hung attempt was gone before the relaunch was verified":
            not survivors,
        "the plan fenced the hung attempt (its epoch rose: attempt 2 planned)":
            any(p.attempt == 2 for p in plans),
        "the job finished": code == 0,
    }  # fmt: skip
    return judged(result, checks, phases=phase.verdict == "pass")
