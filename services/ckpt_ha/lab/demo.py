"""The demo: write one small native checkpoint, announce it as committed, and wait until the
integrity-checker verified it and the registrar recorded the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat, CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.ops import manual
from ckpt_ha.ops.errors import NotSettled
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.storage import ObjectStore

SETTLE_WAIT_S = 15.0


@dataclass(frozen=True)
class DemoCheckpoint:
    prefix: str
    checkpoint_id: str
    shards: int
    committed: Envelope[EventData]


def write(store: ObjectStore, job_id: str, step: int, now: datetime) -> DemoCheckpoint:
    """Two shards and a manifest under ``<job>/step-<step>-<time>``, and its committed event."""
    prefix = f"{job_id}/step-{step:08d}-{now.strftime('%Y%m%dT%H%M%S')}"
    shards = {f"shard-{i}.bin": bytes([i]) * (64 * 1024) for i in range(2)}
    native.write(store, prefix, shards, step=step, created_at=now)
    # The id the writer-watcher derives from the same files, so both name one checkpoint.
    checkpoint_id = checkpoint_id_on(store, prefix)
    event = build(
        CheckpointCommittedV1(
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            uri=store.uri(prefix),
            run_id="demo-run",
            step=step,
            format=CheckpointFormat.NATIVE,
            shard_count=len(shards),
            total_bytes=sum(len(v) for v in shards.values()),
        ),
        source="ckpt-ha/demo",
        time=now,
        key=checkpoint_id,
    )
    return DemoCheckpoint(prefix, checkpoint_id, len(shards), event)


async def announce(
    publisher: Publisher,
    registry: Registry,
    demo: DemoCheckpoint,
    *,
    timeout_s: float = SETTLE_WAIT_S,
) -> CheckpointRecord:
    """Publish the committed event; the record once it is valid or quarantined."""
    await publisher.publish(demo.committed)
    settled = {CheckpointState.VALID, CheckpointState.QUARANTINED}

    async def verdict() -> CheckpointRecord | None:
        record = await registry.get(demo.checkpoint_id)
        return record if record is not None and record.state in settled else None

    record = await manual.until(verdict, timeout_s=timeout_s)
    if record is None:
        raise NotSettled(demo.checkpoint_id, timeout_s)
    return record
