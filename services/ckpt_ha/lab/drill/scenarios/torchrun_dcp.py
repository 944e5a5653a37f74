"""torchrun + PyTorch DCP: one rank of a 2-rank job is SIGKILLed mid-training, then once more
in the middle of a save (every rank's data written, ``.metadata`` and the commit not yet)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ckpt_ha.lab.drill.assess import assess_restore, judged, partial_checkpoint
from ckpt_ha.lab.drill.harness import (
    Drill,
    policy,
    progress_at_least,
    resumed_after,
    uncommitted_writes,
    valid_count,
)
from ckpt_ha.lab.drill.workloads import TORCHRUN_DCP

NAME = "torchrun-dcp"
FAULT = "one rank of a 2-rank torchrun job is SIGKILLed, once mid-training and once mid-save"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""
REQUIRES = ("torch",)
"""Python packages the drill's job needs (the ``torch`` extra)."""


def _shards(folder: Path) -> list[Path]:
    return list(folder.glob("__*.distcp"))


async def run(drill: Drill) -> dict[str, Any]:
    """Kill rank 1 mid-training: torchrun ends the group, the runner reports the rank's own
    cause, every rank of the relaunch loads the planned checkpoint and the run continues
    exactly. Then kill rank 1 while a checkpoint is half written: it is never committed, and the
    relaunch resumes from the newest complete one."""
    async with drill.session() as registry:
        drill.launch(
            policy(),
            ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
             "--slow-save", "3"],
            {},
            TORCHRUN_DCP,
        )  # fmt: skip
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")
        fault = await drill.kill_rank(1)
        await drill.until(lambda: resumed_after(drill, fault), "the first resume verdict")

        async def mid_save() -> str | None:
            """A checkpoint announced after the fault whose ranks' data files are all written
            but which is not committed yet."""
            for cid, folder in (await uncommitted_writes(drill, fault)).items():
                shards = await asyncio.to_thread(_shards, folder)
                if len(shards) >= TORCHRUN_DCP.processes:
                    return cid
            return None

        partial = await drill.until(mid_save, "a checkpoint half written", every=0.1)
        second = await drill.kill_rank(1)
        await drill.until(lambda: resumed_after(drill, second), "the second resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        partial_record = await registry.get(partial)
    first = assess_restore(NAME, [e for e in events if e.time < second], drill.job, fault)
    after_save = assess_restore(f"{NAME}/mid-save", events, drill.job, second)
    result = first.to_json()
    result["phases"] = [first.to_json(), after_save.to_json()]
    failures = [e.data for e in events if ".job.failed.v" in e.type]
    result["failures"] = [
        {"cause": str(f.__dict__.get("cause")), "side": str(f.__dict__.get("side")),
         "signal": f.__dict__.get("signal"), "detail": f.__dict__.get("detail")}
        for f in failures
    ]  # fmt: skip
    state = partial_record.state.value if partial_record else None
    tombstone = partial_record.tombstone if partial_record else None
    result["partial_checkpoint"] = partial_checkpoint(
        events, partial, state, tombstone.actor if tombstone else None
    )
    faked = result["partial_checkpoint"]["committed_or_registered"]
    result["job"], result["job_exit_code"] = drill.job, code
    signatures = {f.__dict__.get("signature") for f in failures}
    checks = {
        "each rank kill was reported as the rank's own cause (node_exit, SIGKILL, rank named)":
            len(failures) == 2 and all(
                f["cause"] == "node_exit" and f["signal"] == 9 and "rank" in str(f["detail"])
                for f in result["failures"]
            ),
        "the two kills carry one signature (the same failure, not torchrun's banner)":
            len(signatures) == 1,
        "the half-written checkpoint was never committed or registered": not faked,
        "the second restore used the newest complete checkpoint":
            after_save.restored_from == after_save.last_valid_checkpoint is not None,
        "the job finished": code == 0,
    }  # fmt: skip
    return judged(result, checks, phases=first.verdict == after_save.verdict == "pass")
