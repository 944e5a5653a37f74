"""Training-side SDK: save checkpoints that ckpt-ha can prove complete.

`save()` writes every shard first (each durable before the next step), then the native
manifest last and create-only, and announces `checkpoint.committed` under the same checkpoint
id the writer-watcher derives from the files. If the bus is down the save still succeeds: the
watcher finds the checkpoint on storage.
"""

from __future__ import annotations

import asyncio
import io
import logging
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import nats
import numpy as np

from contracts import build
from contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    RuntimeEnvironment,
)
from contracts.subjects import DEFAULT_PREFIX, event_subject
from services.shared.clock import Clock, utc_now
from services.shared.formats import native
from services.shared.formats.identity import checkpoint_id_on
from services.shared.formats.paths import inside
from services.shared.storage import open_store

log = logging.getLogger("ckpt_ha.sdk")

State = Mapping[str, "bytes | np.ndarray"]


@dataclass(frozen=True)
class Saved:
    checkpoint_id: str
    uri: str
    step: int
    manifest: native.Manifest
    announced: bool
    """False when the bus could not be reached: the writer-watcher will announce it instead."""


@dataclass(frozen=True)
class Bus:
    """Where to announce: a NATS URL plus the subject prefix (defaults match the services)."""

    url: str
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = 5.0


def _encode(state: State) -> dict[str, bytes]:
    shards: dict[str, bytes] = {}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            buf = io.BytesIO()
            np.save(buf, value, allow_pickle=False)
            shards[f"{name}.npy"] = buf.getvalue()
        elif isinstance(value, bytes):
            shards[name] = value
        else:
            raise TypeError(f"shard {name!r}: bytes or numpy array expected, got {type(value)}")
    return shards


def save(
    storage_root: str,
    job_id: str,
    step: int,
    state: State,
    *,
    run_id: str,
    attempt: int = 1,
    code_version: str | None = None,
    data_snapshot: str | None = None,
    config_hash: str | None = None,
    exact_resume: bool = True,
    bus: Bus | None = None,
    clock: Clock = utc_now,
) -> Saved:
    """Write ``state`` as checkpoint ``<job_id>/step-<step>`` and announce it (best effort)."""
    if inside(job_id) != job_id or "/" in job_id:
        raise ValueError(f"job id {job_id!r} must be one path component")
    store = open_store(storage_root)
    prefix = f"{job_id}/step-{step:08d}"
    now = clock()
    identity = CheckpointIdentity(
        job_id=job_id,
        run_id=run_id,
        attempt=attempt,
        code_version=code_version,
        data_snapshot=data_snapshot,
        config_hash=config_hash,
        environment=RuntimeEnvironment(
            framework="numpy",
            framework_version=np.__version__,
            python_version=platform.python_version(),
        ),
        created_at=now,
    )
    shards = _encode(state)
    manifest = native.write(
        store, prefix, shards, step=step, created_at=now, identity=identity,
        exact_resume=exact_resume,
    )  # fmt: skip
    checkpoint_id = checkpoint_id_on(store, prefix)
    uri = store.uri(prefix)
    event = CheckpointCommittedV1(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        uri=uri,
        run_id=run_id,
        step=step,
        format=CheckpointFormat.NATIVE,
        identity=identity,
        shard_count=len(shards),
        total_bytes=sum(len(v) for v in shards.values()),
    )
    announced = False
    if bus is not None:
        try:
            asyncio.run(asyncio.wait_for(_announce(bus, event, now), timeout=bus.timeout_s * 2))
            announced = True
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            log.warning("checkpoint %s saved; announcing it failed (%r)", checkpoint_id, exc)
    return Saved(checkpoint_id, uri, step, manifest, announced)


async def _announce(bus: Bus, data: CheckpointCommittedV1, now: datetime) -> None:
    envelope = build(data, source="ckpt-ha/sdk", time=now, key=data.checkpoint_id)
    nc = await nats.connect(
        bus.url, connect_timeout=bus.timeout_s, max_reconnect_attempts=1, allow_reconnect=False
    )
    try:
        await nc.jetstream().publish(
            event_subject(bus.prefix, "checkpoint.committed", 1, data.job_id),
            envelope.to_bytes(),
            timeout=bus.timeout_s,
            headers={"Nats-Msg-Id": envelope.id},
        )
    finally:
        await nc.close()
