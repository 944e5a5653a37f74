"""Copies of valid checkpoints on a replica (issue 29), against the real NATS, Redis and S3
(moto's server) with the registrar and the integrity-checker as processes (`ckpt-ha serve`).

* Filesystem → S3 and S3 → S3: a job on the ``critical`` tier saves through the SDK; its valid
  checkpoint is copied to the replica bucket, verified there and recorded as a valid copy of
  the same checkpoint (same id), byte for byte what the primary holds.
* A copy interrupted mid-way (the integrity-checker killed, SIGKILL, while it streams under a
  small read budget) stays ``copying`` with no commit evidence on the replica; the restarted
  checker resumes it at the same place: one copy, one ``valid``, never the half copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState, CopyState, TierChosenV1
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native, verify
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.stack import start_service
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import ObjectStore, S3Store, key_for_uri, open_store
from tests.support.bus_tools import job_key, stream_messages, wait_for
from tests.support.cli_tools import stack_env
from tests.support.moto_server import aws_env, s3_client, start_moto_server

JOB = "job-copies"


@dataclass(frozen=True)
class Buckets:
    endpoint: str
    client: Any

    def new(self) -> str:
        name = f"copies-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name


@pytest.fixture
def s3() -> Iterator[Buckets]:
    endpoint, stop = start_moto_server()
    try:
        yield Buckets(endpoint, s3_client(endpoint))
    finally:
        stop()


@dataclass
class Copying:
    primary: ObjectStore
    replica: ObjectStore
    replica_root: str
    env: dict[str, str]
    home: Path
    registry: Registry
    checker: procs.ManagedProcess | None = None

    def start_checker(self, **extra: str) -> None:
        self.checker = start_service("integrity-checker", self.home, {**self.env, **extra},
                                     timeout=60)  # fmt: skip


def store_on(root: str, buckets: Buckets) -> ObjectStore:
    if root.startswith("s3://"):
        bucket, _, prefix = root[len("s3://") :].partition("/")
        return S3Store(bucket, prefix, client=buckets.client)
    return open_store(root)


@pytest.fixture(params=["fs-to-s3", "s3-to-s3"])
async def copying(
    request: pytest.FixtureRequest,
    s3: Buckets,
    settings: ServiceSettings,
    producer: Bus,
    tmp_path: Path,
) -> AsyncIterator[Copying]:
    if request.param == "fs-to-s3":
        (tmp_path / "primary").mkdir()
        primary_root = str(tmp_path / "primary")
    else:
        primary_root = f"s3://{s3.new()}/train"
    replica_root = f"s3://{s3.new()}/copies"
    env = {
        **stack_env(settings),
        **aws_env(s3.endpoint),
        "CKPT_HA_STORAGE_ROOT": primary_root,
        "CKPT_HA_REPLICA_ROOTS": json.dumps({"critical": replica_root}),
        "CKPT_HA_COPY_INTERVAL_S": "0.5",
        "CKPT_HA_SCRUB_INTERVAL_S": "0",
        "CKPT_HA_LOOP_LEASE_S": "3",
        "CKPT_HA_ACK_WAIT_S": "5",
        "CKPT_HA_GRACEFUL_TIMEOUT_S": "5",
    }
    registrar = start_service("registrar", tmp_path, env, timeout=60)
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    chosen = TierChosenV1(job_id=JOB, tier="critical", reason="copies test", actor="test")
    await producer.publish(build(chosen, source="test", time=_now(), key="tier"))

    async def critical() -> bool:
        return (await registry.tier_of(JOB)).tier.name == "critical"

    await wait_for(critical, timeout=20, what="the critical tier recorded")
    setup = Copying(
        store_on(primary_root, s3), store_on(replica_root, s3), replica_root, env, tmp_path,
        registry,
    )  # fmt: skip
    try:
        yield setup
    finally:
        for proc in (setup.checker, registrar):
            if proc is not None:
                with contextlib.suppress(Exception):
                    procs.stop(proc, timeout=15)
        await registry.close()


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def save(store: ObjectStore, settings: ServiceSettings, step: int, mib: int) -> sdk.Saved:
    rng = np.random.default_rng(step)
    state = {
        "weights": rng.standard_normal((mib * 2**18,)).astype(np.float32),  # mib MiB
        "optimizer": {"step": step, "lr": 3e-4},
    }
    bus = sdk.BusEndpoint(settings.nats_url, prefix=settings.subject_prefix, job_key=job_key(JOB))
    return sdk.save(store, JOB, step, state, run_id="run-1", project="copies", bus=bus)


async def record_where(
    registry: Registry, checkpoint_id: str, ok: Any, what: str, timeout: float = 60
) -> CheckpointRecord:
    async def probe() -> CheckpointRecord | None:
        rec = await registry.get(checkpoint_id)
        return rec if rec is not None and ok(rec) else None

    found = await wait_for(probe, timeout=timeout, what=what)
    assert found is not None
    return found


def copy_state(rec: CheckpointRecord, uri: str) -> CopyState | None:
    copy = rec.copies.get(uri)
    return copy.state if copy is not None else None


async def copy_events(settings: ServiceSettings, checkpoint_id: str) -> list[str]:
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    docs = [json.loads(m.data) for m in msgs]
    return [
        d["data"]["copy_state"]
        for d in docs
        if d["type"] == "ckpt-ha.checkpoint.copy_changed.v1"
        and d["data"]["checkpoint_id"] == checkpoint_id
    ]


async def test_a_valid_checkpoint_is_copied_to_the_replica_and_recorded(
    copying: Copying, settings: ServiceSettings
) -> None:
    copying.start_checker()
    saved = await asyncio.to_thread(save, copying.primary, settings, 100, 1)
    key = key_for_uri(copying.primary, saved.uri)
    assert key is not None
    copy_uri = copying.replica.uri(key)
    rec = await record_where(
        copying.registry, saved.checkpoint_id,
        lambda r: copy_state(r, copy_uri) is CopyState.VALID, "a valid copy recorded",
    )  # fmt: skip
    assert rec.state is CheckpointState.VALID  # the lifecycle is the primary's
    assert list(rec.copies) == [copy_uri]
    copied = verify(copying.replica, key)
    assert copied.ok
    assert copied.checksums == rec.checksums
    for info in copying.primary.list(f"{key}/"):
        assert copying.replica.read_bytes(info.key) == copying.primary.read_bytes(info.key)
    assert await copy_events(settings, saved.checkpoint_id) == ["copying", "valid"]


@pytest.mark.parametrize("copying", ["fs-to-s3"], indirect=True)  # the same code for S3 → S3
async def test_a_copy_killed_mid_way_resumes_without_a_half_copy_counted_valid(
    copying: Copying, settings: ServiceSettings
) -> None:
    # 24 MiB at 3 MiB/s: about 8 s of copying, killed once a few objects are on the replica.
    copying.start_checker(CKPT_HA_COPY_BYTES_PER_S=str(3 * 2**20),
                          CKPT_HA_COPY_BURST_BYTES=str(2**20))  # fmt: skip
    saved = await asyncio.to_thread(save, copying.primary, settings, 200, 24)
    key = key_for_uri(copying.primary, saved.uri)
    assert key is not None
    copy_uri = copying.replica.uri(key)
    await record_where(
        copying.registry, saved.checkpoint_id,
        lambda r: copy_state(r, copy_uri) is CopyState.COPYING, "the copy started",
    )  # fmt: skip

    async def some_copied() -> bool:
        return any(True for _ in copying.replica.list(f"{key}/"))

    await wait_for(some_copied, timeout=30, what="a first object on the replica")
    assert copying.checker is not None
    os.kill(copying.checker.pid, signal.SIGKILL)
    procs.stop(copying.checker, timeout=10)
    await asyncio.sleep(1.0)
    half = await copying.registry.get(saved.checkpoint_id)
    assert half is not None
    assert copy_state(half, copy_uri) is CopyState.COPYING
    assert not copying.replica.exists(f"{key}/{native.MANIFEST}")  # never looks committed
    assert await copy_events(settings, saved.checkpoint_id) == ["copying"]
    there = {i.key for i in copying.replica.list(f"{key}/")}

    copying.start_checker()  # unlimited: the rest goes at once
    rec = await record_where(
        copying.registry, saved.checkpoint_id,
        lambda r: copy_state(r, copy_uri) is CopyState.VALID, "the resumed copy valid",
    )  # fmt: skip
    assert list(rec.copies) == [copy_uri]  # the same copy, not a second one
    assert verify(copying.replica, key).checksums == rec.checksums
    assert await copy_events(settings, saved.checkpoint_id) == ["copying", "valid"]
    assert there <= {i.key for i in copying.replica.list(f"{key}/")}
