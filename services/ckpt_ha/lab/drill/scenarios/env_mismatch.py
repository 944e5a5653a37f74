"""Environment mismatch: the checkpoints record another framework version than the target."""

from __future__ import annotations

import asyncio
from typing import Any

from ckpt_ha.contracts.job import JobPolicy
from ckpt_ha.lab.drill.harness import Drill, escalated, expect_escalation, valid_count

NAME = "env-mismatch"
FAULT = "the checkpoints record another framework version than the restore target"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""


async def run(drill: Drill) -> dict[str, Any]:
    """The checkpoints were written with another framework version than the restore target
    runs: compatibility is unknown, nothing is resumed automatically."""
    async with drill.session() as registry:
        drill.launch(
            JobPolicy(tier="drill"),
            ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--written-with-framework", "0.0.0-drill"],
            {},
        )  # fmt: skip
        await drill.until(lambda: valid_count(drill, registry, 1), "a valid checkpoint")
        fault = await drill.kill_training()
        await drill.until(lambda: escalated(drill), "the escalation")
        code = await drill.wait_exit()
        await asyncio.sleep(1.0)
        events = await drill.events()
    return expect_escalation("env-mismatch", drill, events, fault, code, {"compatibility_unknown"})
