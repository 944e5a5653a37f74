"""Corrupt checkpoint: the newest valid checkpoint's bytes are damaged on storage."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.lab.drill.assess import assess_restore, judged
from ckpt_ha.lab.drill.harness import (
    Drill,
    DrillFailed,
    as_awaitable,
    policy,
    resumed_after,
    valid_count,
)
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.storage import key_for_uri

NAME = "corrupt-checkpoint"
FAULT = "the newest valid checkpoint's bytes are damaged on storage"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = "CkptHaCheckpointCorrupt"
"""The page this drill must raise (checked when the stack runs Prometheus)."""


def _flip(data: bytes) -> bytes:
    """One flipped bit pattern, same size: only a checksum can tell."""
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def _damage(drill: Drill, record: CheckpointRecord) -> str:
    """Damage the last array shard of ``record`` in place; its name. On S3 the object is
    rewritten with the same size and metadata (S3 has no partial overwrite)."""
    if not drill.on_s3:
        shard = _newest_shard(record)
        shard.write_bytes(_flip(shard.read_bytes()))
        return shard.name
    store = drill.store()
    folder = key_for_uri(store, record.uri)
    if folder is None:
        raise DrillFailed(f"{record.uri} is outside the storage root {drill.state.storage_root}")
    keys = sorted(o.key for o in store.list(folder + "/") if o.key.endswith(".npy"))
    if not keys:
        raise DrillFailed(f"no array shard in {record.uri}")
    info = store.stat(keys[-1])
    store.put(keys[-1], _flip(store.read_bytes(keys[-1])), metadata=info.metadata)
    return keys[-1].rsplit("/", 1)[-1]


def _newest_shard(record: CheckpointRecord) -> Path:
    folder = Path(record.uri.removeprefix("file://"))
    if not folder.is_dir():
        raise DrillFailed(f"{record.uri} is not a local folder (the drill damages files by hand)")
    shards = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix == ".npy")
    if not shards:
        raise DrillFailed(f"no array shard in {record.uri}")
    return shards[-1]


async def settled(drill: Drill, registry: Registry) -> list[CheckpointRecord] | None:
    """The job's valid checkpoints once none is still being written or verified."""
    records = await drill.records(registry)
    if any(r.state.value in ("writing", "pending_verification") for r in records):
        return None
    return [r for r in records if r.state.value == "valid"] or None


async def run(drill: Drill) -> dict[str, Any]:
    """The newest valid checkpoint is damaged on storage after it was registered; the job then
    dies. The restore must catch the damage at load, quarantine it, and fall back."""
    async with drill.session() as registry:
        drill.launch(policy(), ["--steps", "60", "--checkpoint-every", "10",
                                 "--sleep-per-step", "0.05"], {})  # fmt: skip
        await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        # The job is held still while its newest valid checkpoint is chosen and damaged, so
        # that no newer one can become valid meanwhile (a write on S3 takes a moment) and be
        # the one the restore picks.
        pid = await drill.until(lambda: as_awaitable(drill.training_pid()), "the training process")
        os.kill(pid, signal.SIGSTOP)
        drill.progress(f"training process {pid} paused")
        valid = await drill.until(lambda: settled(drill, registry), "its checkpoints to settle")
        newest = max(valid, key=lambda r: r.step or 0)
        shard = await asyncio.to_thread(_damage, drill, newest)
        drill.fault(f"damaged {shard} of {newest.checkpoint_id} (step {newest.step})")
        fault = await drill.kill_training()
        await drill.until(lambda: resumed_after(drill, fault), "a resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        damaged = await registry.get(newest.checkpoint_id)
    phase = assess_restore("corrupt-checkpoint", events, drill.job, fault)
    result = phase.to_json()
    load_failed = [e for e in events if ".resume.load_failed.v" in e.type
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
    return judged(result, checks, phases=phase.verdict == "pass")
