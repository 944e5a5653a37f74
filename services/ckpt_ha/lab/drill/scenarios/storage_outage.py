"""Storage outage: the storage root goes away during a checkpoint write and during a restore.

On a filesystem root the root is moved away, as when its volume is unmounted; on S3 the stack's
storage link (`ckpt_ha.lab.devstack.tcp_link`) is cut, so the services and the job lose the server
while it keeps running, as when the network to it fails."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.lab.devstack import stack
from ckpt_ha.lab.drill.assess import assess_restore, judged
from ckpt_ha.lab.drill.harness import (
    Drill,
    DrillFailed,
    policy,
    progress_at_least,
    resumed_after,
    valid_count,
)
from ckpt_ha.runtime import local_stack

NAME = "storage-outage"
FAULT = "the storage root is unavailable during a checkpoint write and a restore"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
"""The page this drill must raise (checked when the stack runs Prometheus)."""


class _Outage:
    """The stack's storage taken away and given back. A filesystem root is moved away, as when
    its volume is unmounted (the stores answer `StorageUnavailable` and create nothing in its
    place); an S3 server is cut off at the stack's storage link."""

    def __init__(self, state: local_stack.StackState) -> None:
        self.state = state
        self.down = False
        root = state.storage_root
        self.on_s3 = urlsplit(root).scheme == "s3"
        if self.on_s3 and not state.storage_endpoint:
            raise DrillFailed(
                f"storage-outage on {root} cuts the stack's storage link, and this stack reaches "
                "S3 without one: start it with `ckpt-ha drill --storage s3://…` (or `ckpt-ha up "
                "--storage s3://…`) and AWS_ENDPOINT_URL set"
            )
        if not self.on_s3 and "://" in root and not root.startswith("file://"):
            raise DrillFailed(f"storage-outage cannot take {root} away")
        self.root = Path(root.removeprefix("file://"))
        self.away = self.root.with_name(f"{self.root.name}.outage")

    def begin(self) -> None:
        try:
            if self.on_s3:
                stack.cut_storage(self.state)
            else:
                os.rename(self.root, self.away)
        except (stack.StackConflict, OSError) as exc:
            raise DrillFailed(f"could not take the storage away: {exc}") from None
        self.down = True

    def end(self) -> None:
        if not self.down:
            return
        if self.on_s3:
            stack.restore_storage(self.state)
        else:
            os.rename(self.away, self.root)
        self.down = False


async def run(drill: Drill) -> dict[str, Any]:
    """Storage goes away twice: in the middle of a checkpoint write (the job trains on), and
    while the job is being restored after it died. No fake-complete checkpoint may appear, the
    interrupted write must be blamed on the infrastructure, the restore must wait for storage
    within its limits and resume from the last valid checkpoint, and the job must finish."""
    outage = _Outage(drill.state)
    registry = drill.registry()
    outage_write, outage_restore = 8.0, 5.0  # the write's longer than the stall timeout (5 s)
    try:
        drill.launch(
            policy(),
            ["--steps", "130", "--checkpoint-every", "10", "--sleep-per-step", "0.1",
             "--slow-save", "1.5"],
            {"CKPT_HA_RESTORE_STORAGE_WAIT_S": "30"},
        )  # fmt: skip
        valid = await drill.until(lambda: valid_count(drill, registry, 1), "a valid checkpoint")
        since = datetime.now(UTC)

        async def mid_write() -> str | None:
            events = await drill.events()
            writing = [e.data.__dict__.get("checkpoint_id") for e in events
                       if e.type.endswith("checkpoint.writing.v1") and e.time > since]  # fmt: skip
            done = {e.data.__dict__.get("checkpoint_id") for e in events
                    if e.type.endswith("checkpoint.committed.v1")}  # fmt: skip
            pending = [c for c in writing if c not in done]
            return pending[-1] if pending else None

        hit = await drill.until(mid_write, "a checkpoint being written", every=0.05)
        outage.begin()
        write_fault = drill.fault(f"storage unavailable for {outage_write:g} s during the write "
                                  f"of {hit}")  # fmt: skip
        await asyncio.sleep(outage_write)
        outage.end()
        drill.progress("storage back")

        async def failed_write() -> list[Envelope[EventData]] | None:
            return [e for e in await drill.events() if e.type.endswith("checkpoint.write_failed.v1")
                    and e.data.__dict__.get("checkpoint_id") == hit] or None  # fmt: skip

        await drill.until(failed_write, "the interrupted write to be declared failed")
        before = len(await valid_count(drill, registry, 1) or [])
        valid = await drill.until(lambda: valid_count(drill, registry, before + 1),
                                  "a new valid checkpoint after the outage")  # fmt: skip
        # A few steps past it, so the resumed run recomputes steps the first attempt reported.
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")
        restore_fault = await drill.kill_training()
        outage.begin()
        drill.fault(f"storage unavailable for {outage_restore:g} s during the restore")
        await asyncio.sleep(outage_restore)
        outage.end()
        back = datetime.now(UTC)
        drill.progress("storage back")
        await drill.until(lambda: resumed_after(drill, restore_fault), "the resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        hit_record = await registry.get(hit)
        records = await drill.records(registry)
    finally:
        outage.end()
        drill.stop()
        await registry.close()
    write_phase = assess_restore("storage-outage/write", [e for e in events
                                 if e.time < restore_fault], drill.job, write_fault)  # fmt: skip
    restore_phase = assess_restore("storage-outage/restore", events, drill.job, restore_fault)
    mine = [e for e in events if e.data.job_id == drill.job]

    def about(kind: str, cid: str | None = None) -> list[Envelope[EventData]]:
        return [e for e in mine if e.type.startswith(f"ckpt-ha.{kind}.v")
                and (cid is None or e.data.__dict__.get("checkpoint_id") == cid)]  # fmt: skip

    write_failed = about("checkpoint.write_failed", hit)
    faked = about("checkpoint.committed", hit) + about("checkpoint.registered", hit)
    failed_jobs = [e for e in about("job.failed") if write_fault <= e.time < restore_fault]
    loaded = [e for e in about("resume.loaded") if e.time >= restore_fault]
    load_failed = [e for e in about("resume.load_failed") if e.time >= restore_fault]
    quarantined = about("checkpoint.quarantined")
    progress_during = [
        e
        for e in about("job.progress")
        if write_fault <= e.time < write_fault + timedelta(seconds=outage_write)
    ]
    last_valid = restore_phase.last_valid_checkpoint
    result = {**restore_phase.to_json(), "scenario": "storage-outage"}
    result["phases"] = [write_phase.to_json(), restore_phase.to_json()]
    # The write phase has no restore: its levels are about the restore after the second outage.
    result["phases"][0]["verdict"] = "n/a"
    result["phases"][0]["expected_levels"] = []
    result["interrupted_write"] = {
        "checkpoint_id": hit,
        "state": hit_record.state.value if hit_record else None,
        "write_failed": [{"event_id": e.id, "side": str(e.data.__dict__.get("side")),
                          "reason": e.data.__dict__.get("reason")} for e in write_failed],
        "committed_or_registered": [e.id for e in faked],
    }  # fmt: skip
    result["restore_wait"] = {
        "storage_back": back.isoformat(),
        "loaded": [{"event_id": e.id, "time": e.time.isoformat(), "checkpoint_id":
                    e.data.__dict__.get("checkpoint_id")} for e in loaded],
        "load_failed": [e.id for e in load_failed],
        "quarantined": [e.data.__dict__.get("checkpoint_id") for e in quarantined],
    }  # fmt: skip
    result["valid_checkpoints"] = sorted(r.step or 0 for r in records if r.state.value == "valid")
    result["job"], result["job_exit_code"] = drill.job, code
    side_ok = any(
        w["side"] == "infrastructure" for w in result["interrupted_write"]["write_failed"]
    )
    checks = {
        "no fake-complete checkpoint: the interrupted write was never committed or registered":
            not faked and (hit_record is None or hit_record.state.value != "valid"),
        "the interrupted write was declared failed on the infrastructure side": side_ok,
        "the job trained on through the write outage (no failure, progress reported)":
            not failed_jobs and bool(progress_during),
        "the restore waited for storage and loaded after it came back":
            bool(loaded) and loaded[0].time >= back and not load_failed,
        "the restore used the last valid checkpoint": restore_phase.restored_from == last_valid,
        "no checkpoint was quarantined because of the outage": not quarantined,
        "the job finished": code == 0,
    }  # fmt: skip
    return judged(result, checks, phases=restore_phase.verdict == "pass")
