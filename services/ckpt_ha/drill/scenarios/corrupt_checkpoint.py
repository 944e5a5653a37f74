"""Corrupt checkpoint: the newest valid checkpoint's bytes are damaged on storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.drill.assess import assess_restore
from ckpt_ha.drill.harness import Drill, DrillFailed, policy, resumed_after, valid_count

NAME = "corrupt-checkpoint"
FAULT = "the newest valid checkpoint's bytes are damaged on storage"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = "CheckpointCorrupt"
"""The page this drill must raise (checked when the stack runs Prometheus)."""


def _newest_shard(storage_root: str, record: CheckpointRecord) -> Path:
    folder = Path(record.uri.removeprefix("file://"))
    if not folder.is_dir():
        raise DrillFailed(f"{record.uri} is not a local folder (the drill damages files by hand)")
    shards = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix == ".npy")
    if not shards:
        raise DrillFailed(f"no array shard in {record.uri}")
    return shards[-1]


async def run(drill: Drill) -> dict[str, Any]:
    """The newest valid checkpoint is damaged on storage after it was registered; the job then
    dies. The restore must catch the damage at load, quarantine it, and fall back."""
    registry = drill.registry()
    try:
        drill.launch(policy(), ["--steps", "60", "--checkpoint-every", "10",
                                 "--sleep-per-step", "0.05"], {})  # fmt: skip
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(valid, key=lambda r: r.step or 0)
        shard = _newest_shard(drill.state.storage_root, newest)
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF  # one flipped bit pattern, same size: only a checksum can tell
        shard.write_bytes(bytes(data))
        drill.fault(f"damaged {shard.name} of {newest.checkpoint_id} (step {newest.step})")
        fault = await drill.kill_training()
        await drill.until(lambda: resumed_after(drill, fault), "a resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        damaged = await registry.get(newest.checkpoint_id)
    finally:
        drill.stop()
        await registry.close()
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
    result["checks"] = checks
    result["reasons"] += [f"not met: {what}" for what, ok in checks.items() if not ok]
    result["verdict"] = "pass" if phase.verdict == "pass" and all(checks.values()) else "fail"
    return result
