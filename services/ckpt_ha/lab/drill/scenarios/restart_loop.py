"""Restart loop: the job crashes right after every resume; retries must stop and escalate."""

from __future__ import annotations

import asyncio
from typing import Any

from ckpt_ha.contracts.job import JobPolicy
from ckpt_ha.lab.drill.harness import Drill, escalated, expect_escalation, valid_count

NAME = "restart-loop"
FAULT = "the job crashes right after every resume"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = "CkptHaRestartLoop"
"""The page this drill must raise (checked when the stack runs Prometheus)."""


async def run(drill: Drill) -> dict[str, Any]:
    """The job crashes right after every resume: automatic retries must stop and escalate."""
    async with drill.session() as registry:
        drill.launch(
            JobPolicy(tier="drill", max_restarts=2, max_same_failure=3),
            ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--crash-after-resume"],
            {},
        )  # fmt: skip
        await drill.until(lambda: valid_count(drill, registry, 1), "a valid checkpoint")
        fault = await drill.kill_training()
        await drill.until(lambda: escalated(drill), "the escalation")
        code = await drill.wait_exit()
        await asyncio.sleep(1.0)  # anything that would still follow the escalation
        events = await drill.events()
    return expect_escalation(
        "restart-loop", drill, events, fault, code, {"restart_loop", "same_failure_repeating"}
    )
