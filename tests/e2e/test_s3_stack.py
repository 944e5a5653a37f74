"""The intake services as separate processes against S3 (moto's server), the real NATS and Redis.

writer-watcher, integrity-checker and registrar run as `ckpt-ha serve <name>` with
``CKPT_HA_STORAGE_ROOT=s3://<bucket>/<prefix>``; they find the S3 endpoint and credentials the
way any boto3 program does (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``). A job saves through the SDK: a good checkpoint ends valid and registered,
one whose shard the storage silently corrupted on write ends corrupt and quarantined.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import boto3
import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.devstack import procs
from ckpt_ha.devstack.stack import start_service
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import ObjectInfo, S3Store
from tests.support.bus_tools import job_key, stream_messages, wait_for
from tests.support.cli_tools import stack_env
from tests.support.moto_server import FAKE_ACCESS_KEY, FAKE_SECRET_KEY, start_moto_server

pytestmark = pytest.mark.e2e

SERVICES = ("registrar", "integrity-checker", "writer-watcher")
PREFIX = "checkpoints"


@dataclass(frozen=True)
class S3Stack:
    bucket: str
    client: Any
    """The test's own S3 client, on the same bucket the services use."""
    root: str
    processes: tuple[procs.ManagedProcess, ...]

    @property
    def store(self) -> S3Store:
        return S3Store(self.bucket, PREFIX, client=self.client)


def service_env(settings: ServiceSettings, endpoint: str, root: str) -> dict[str, str]:
    return {
        **stack_env(settings),
        "CKPT_HA_STORAGE_ROOT": root,
        "CKPT_HA_POLL_INTERVAL_S": "0.3",
        "CKPT_HA_ACK_WAIT_S": "5",
        "CKPT_HA_BACKOFF_S": "[0.2, 0.5, 1]",
        "CKPT_HA_GRACEFUL_TIMEOUT_S": "5",
        # What any boto3 program reads; the services take no S3 settings of their own.
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }


@pytest.fixture
def s3_stack(settings: ServiceSettings, tmp_path: Path) -> Iterator[S3Stack]:
    endpoint, stop_moto = start_moto_server()
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=FAKE_ACCESS_KEY,
        aws_secret_access_key=FAKE_SECRET_KEY,
    )
    bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/{PREFIX}"
    env = service_env(settings, endpoint, root)
    started: list[procs.ManagedProcess] = []
    try:
        for name in SERVICES:
            started.append(start_service(name, tmp_path, env, timeout=60))
        yield S3Stack(bucket, client, root, tuple(started))
    finally:
        for proc in reversed(started):
            procs.stop(proc, timeout=15)
        stop_moto()
    leftovers = [p.name for p in started if procs.is_alive(p)]
    assert not leftovers, f"still running after stop: {leftovers}"


async def stream_summary(settings: ServiceSettings) -> list[tuple[str, str, str, str]]:
    """(type, checkpoint, source, id) of every event on the stream: the evidence on a failure."""
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    docs = [json.loads(m.data) for m in msgs]
    return [(d["type"], d["data"].get("checkpoint_id", ""), d["source"], d["id"]) for d in docs]


class CorruptingS3Store(S3Store):
    """Storage that silently flips one byte of ``victim`` on write (same size, other bytes)."""

    def __init__(self, stack: S3Stack, victim: str) -> None:
        super().__init__(stack.bucket, PREFIX, client=stack.client)
        self.victim = victim

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        if key.endswith(self.victim) and isinstance(data, bytes):
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        return super().put(key, data, metadata=metadata)


async def test_good_checkpoint_registered_corrupt_one_quarantined_on_s3(
    s3_stack: S3Stack, settings: ServiceSettings
) -> None:
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    weights = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    state = {"weights": weights, "optimizer": {"step": 1, "lr": 3e-4}, "rng": b"\x07" * 32}
    bus = sdk.Bus(settings.nats_url, prefix=settings.subject_prefix, job_key=job_key("job-s3"))

    async def record(checkpoint_id: str) -> CheckpointRecord | None:
        return await registry.get(checkpoint_id)

    try:
        # Good: the SDK announces writing + committed; verified on S3 by another process.
        good = await asyncio.to_thread(
            sdk.save, s3_stack.store, "job-s3", 100, state, run_id="run-1", project="e2e",
            bus=bus,
        )  # fmt: skip
        assert good.uri.startswith(f"{s3_stack.root}/job-s3/")

        async def good_valid() -> CheckpointRecord | None:
            rec = await record(good.checkpoint_id)
            return rec if rec is not None and rec.state is CheckpointState.VALID else None

        rec = await wait_for(good_valid, timeout=45, what="the S3 checkpoint to become valid")
        assert good.announced_writing
        assert [h.state for h in rec.history] == [
            CheckpointState.WRITING,
            CheckpointState.PENDING_VERIFICATION,
            CheckpointState.VALID,
        ], await stream_summary(settings)
        assert rec.identity is not None
        assert rec.identity.project == "e2e"
        assert rec.uri == good.uri

        async def registered() -> bool:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            docs = [json.loads(m.data) for m in msgs]
            return any(
                d["type"] == "ckpt-ha.checkpoint.registered.v1"
                and d["data"]["checkpoint_id"] == good.checkpoint_id
                for d in docs
            )

        assert await wait_for(registered, timeout=20, what="checkpoint.registered")

        # Corrupt: storage flips a byte of one shard; no bus, so the watcher alone finds it.
        flaky = CorruptingS3Store(s3_stack, "state/weights.npy")
        bad = await asyncio.to_thread(
            sdk.save, flaky, "job-s3", 200, state, run_id="run-1", project="e2e"
        )
        assert not bad.announced

        async def bad_quarantined() -> CheckpointRecord | None:
            rec = await record(bad.checkpoint_id)
            return rec if rec is not None and rec.state is CheckpointState.QUARANTINED else None

        rec = await wait_for(bad_quarantined, timeout=45, what="the corrupt checkpoint quarantined")
        states = [h.state for h in rec.history]
        assert states[-3:] == [
            CheckpointState.PENDING_VERIFICATION,
            CheckpointState.CORRUPT,
            CheckpointState.QUARANTINED,
        ]
        assert states[:-3] in ([], [CheckpointState.WRITING])  # did a scan catch it mid-write?
        corrupt = next(h for h in rec.history if h.state is CheckpointState.CORRUPT)
        assert "state/weights.npy: checksum" in (corrupt.reason or "")
        latest = await registry.latest_valid("job-s3")
        assert latest is not None
        assert latest.checkpoint_id == good.checkpoint_id

        # The good one loads back from S3, bit for bit; the bad one is refused on load too.
        loaded = sdk.load(s3_stack.store, "job-s3/step-00000100")
        assert loaded.state["weights"].tobytes() == weights.tobytes()
        with pytest.raises(sdk.CheckpointUnreadable):
            sdk.load(s3_stack.store, "job-s3/step-00000200")
        assert all(procs.is_alive(p) for p in s3_stack.processes)
    finally:
        await registry.close()
