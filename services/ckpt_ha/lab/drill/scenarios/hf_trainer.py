"""Hugging Face Trainer killed mid-save: a real `Trainer` (ckpt-ha's callback) is SIGKILLed
after writing a checkpoint's weights and before its optimizer state."""

from __future__ import annotations

import asyncio
from typing import Any

from ckpt_ha.lab.drill.assess import assess_restore, judged, partial_checkpoint
from ckpt_ha.lab.drill.harness import (
    Drill,
    policy,
    resumed_after,
    uncommitted_writes,
    valid_count,
)
from ckpt_ha.lab.drill.workloads import HF_TRAINER

NAME = "hf-trainer"
FAULT = "a Hugging Face Trainer is SIGKILLed in the middle of saving a checkpoint"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""
REQUIRES = ("torch", "transformers", "accelerate")
"""Python packages the drill's job needs (the ``hf`` extra)."""


async def run(drill: Drill) -> dict[str, Any]:
    """Kill the Trainer while it saves checkpoint-20 (weights written, optimizer state not):
    that folder must never be committed or registered, and the job must resume from the newest
    complete checkpoint through the Trainer's own loader and continue as the baseline did."""
    async with drill.session() as registry:
        drill.launch(
            policy(),
            ["--steps", "30", "--save-steps", "10", "--sleep-per-step", "0.05",
             "--slow-save", "3"],
            {},
            HF_TRAINER,
        )  # fmt: skip
        await drill.until(lambda: valid_count(drill, registry, 1), "a valid checkpoint")

        async def mid_save() -> str | None:
            """A checkpoint being written whose weights are on storage already."""
            for cid, folder in (await uncommitted_writes(drill)).items():
                if await asyncio.to_thread((folder / "model.safetensors").exists):
                    return cid
            return None

        partial = await drill.until(mid_save, "a checkpoint half written", every=0.1)
        fault = await drill.kill_training()
        await drill.until(lambda: resumed_after(drill, fault), "the resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        partial_record = await registry.get(partial)
    phase = assess_restore(NAME, events, drill.job, fault)
    result = phase.to_json()
    state = partial_record.state.value if partial_record else None
    tombstone = partial_record.tombstone if partial_record else None
    result["partial_checkpoint"] = partial_checkpoint(
        events, partial, state, tombstone.actor if tombstone else None
    )
    faked = result["partial_checkpoint"]["committed_or_registered"]
    ended_failed = result["partial_checkpoint"]["ended_failed"]
    result["job"], result["job_exit_code"] = drill.job, code
    checks = {
        "the half-written checkpoint was never committed or registered": not faked,
        "the half-written checkpoint ended write_failed (or deleted by the closure)": ended_failed,
        "the restore used the newest complete checkpoint": phase.restored_from
        == phase.last_valid_checkpoint
        and phase.last_valid_checkpoint is not None,
        "the job finished": code == 0,
    }
    return judged(result, checks, phases=phase.verdict == "pass")
