"""Storage lost: a replicating job's primary storage is wiped after its checkpoints were copied
to the tier's replica; the restore loads the newest valid checkpoint from its copy."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from ckpt_ha.contracts.checkpoint import CopyState
from ckpt_ha.contracts.job import JobPolicy, Tolerance
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.lab.drill.assess import assess_restore, judged
from ckpt_ha.lab.drill.harness import (
    Drill,
    DrillFailed,
    as_awaitable,
    resumed_after,
    valid_count,
)
from ckpt_ha.lab.drill.scenarios.corrupt_checkpoint import settled
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.storage import key_for_uri

NAME = "storage-lost"
FAULT = "the job's primary storage is wiped after its checkpoints were copied to the replica"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus): none, the restore
needs nobody."""


def policy() -> JobPolicy:
    """The drills' policy on the ``critical`` tier, the one that replicates."""
    return JobPolicy(
        tier="critical",
        max_restarts=3,
        tolerances=(Tolerance(metric="loss"),),
        continuity_steps=3,
    )


def copied(record: CheckpointRecord) -> str | None:
    """The URI of a valid copy of ``record`` (None: none yet)."""
    return next((c.uri for c in record.copies.values() if c.state is CopyState.VALID), None)


async def all_copied(drill: Drill, registry: Registry, n: int) -> list[CheckpointRecord] | None:
    """The job's valid checkpoints once at least ``n`` are valid, none is being written or
    verified, and every valid one has a valid copy."""
    valid = await settled(drill, registry)
    if valid is None or len(valid) < n or not all(copied(r) for r in valid):
        return None
    return valid


def _wipe(drill: Drill) -> int:
    """Every object under the job's folder in the primary storage deleted; how many."""
    store = drill.store()
    folder = key_for_uri(store, store.uri(drill.job))
    if folder is None:
        raise DrillFailed(f"the job's folder is outside {drill.state.storage_root}")
    keys = [info.key for info in store.list(f"{folder}/")]
    for key in keys:
        store.delete(key)
    return len(keys)


async def run(drill: Drill) -> dict[str, Any]:
    """The job saves on the ``critical`` tier; once two valid checkpoints have verified copies
    on the replica, the job is held still, its primary storage wiped, and it dies. The restore
    must load the newest valid checkpoint from its copy (not an older one) and continue."""
    async with drill.session() as registry:
        drill.launch(policy(), ["--steps", "120", "--checkpoint-every", "10",
                                 "--sleep-per-step", "0.05"], {})  # fmt: skip
        await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        pid = await drill.until(lambda: as_awaitable(drill.training_pid()), "the training process")
        # Held still until every valid checkpoint has its copy, so that the newest valid one
        # when the storage is wiped is one the replica holds.
        os.kill(pid, signal.SIGSTOP)
        drill.progress(f"training process {pid} paused")
        valid = await drill.until(lambda: all_copied(drill, registry, 2), "every copy valid")
        newest = max(valid, key=lambda r: r.step or 0)
        wiped = await asyncio.to_thread(_wipe, drill)
        drill.fault(f"wiped the job's primary storage ({wiped} objects)")
        fault = await drill.kill_training()
        await drill.until(lambda: resumed_after(drill, fault), "a resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
    phase = assess_restore(NAME, events, drill.job, fault)
    result = phase.to_json()
    plans = [e.data for e in events if isinstance(e.data, ResumePlannedV2) and e.time >= fault]
    plan = plans[0] if plans else None
    copy_uri = copied(newest)
    result["newest_valid_checkpoint"] = newest.checkpoint_id
    result["copy"] = copy_uri
    result["plan"] = (
        {"checkpoint_id": plan.checkpoint_id, "checkpoint_uri": plan.checkpoint_uri,
         "reasons": list(plan.reasons)} if plan is not None else None
    )  # fmt: skip
    result["job"], result["job_exit_code"] = drill.job, code
    checks = {
        "the restore planned the newest valid checkpoint": plan is not None
        and plan.checkpoint_id == newest.checkpoint_id,
        "loaded from its verified copy": plan is not None and plan.checkpoint_uri == copy_uri,
        "the plan says why": plan is not None and any("verified copy" in r for r in plan.reasons),
        "the job finished": code == 0,
    }
    return judged(result, checks, phases=phase.verdict == "pass")
