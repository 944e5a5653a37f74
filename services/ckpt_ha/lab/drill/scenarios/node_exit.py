"""Node exit: the training process is SIGKILLed mid-training, then once more mid-write."""

from __future__ import annotations

from typing import Any

from ckpt_ha.lab.drill.assess import assess_restore
from ckpt_ha.lab.drill.harness import (
    Drill,
    policy,
    progress_at_least,
    resumed_after,
    uncommitted_writes,
    valid_count,
)

NAME = "node-exit"
FAULT = "the training process is SIGKILLed, once mid-training and once mid-write"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""


async def run(drill: Drill) -> dict[str, Any]:
    """SIGKILL the training process mid-training, and once more in the middle of writing a
    checkpoint; both times the system must restore the last valid checkpoint and continue."""
    async with drill.session() as registry:
        drill.launch(
            policy(),
            ["--steps", "90", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--slow-save", "1.5"],
            {},
        )  # fmt: skip
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        # A few steps past the newest checkpoint, so the resumed run recomputes steps the first
        # attempt reported: the continuity check compares them exactly.
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")
        fault = await drill.kill_training()
        await drill.until(lambda: resumed_after(drill, fault), "the first resume verdict")

        # Second fault: in the middle of a checkpoint write (writing announced, not committed).
        async def mid_write() -> bool | None:
            return bool(await uncommitted_writes(drill, fault)) or None

        await drill.until(mid_write, "a checkpoint being written", every=0.05)
        second = await drill.kill_training()
        await drill.until(lambda: resumed_after(drill, second), "the second resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
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
