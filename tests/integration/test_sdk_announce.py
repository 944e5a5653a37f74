"""The SDK's announcements on the real broker, next to a real writer-watcher, on disk and on S3.

`checkpoint.writing` must be on the stream before the first array leaf is written, under the id
the watcher derives; the watcher reporting the same save must not add a second event of either
kind (same event ids, deduplicated by JetStream).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest
import redis.asyncio as aioredis

from ckpt_ha import sdk
from ckpt_ha.formats.identity import checkpoint_id
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore, ObjectInfo, S3Store
from ckpt_ha.writer_watcher import adapters
from ckpt_ha.writer_watcher.app import build as build_watcher
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings
from tests.support.bus_tools import job_key, stream_messages
from tests.support.moto_server import (
    s3_client,
    start_moto_server,
)

pytestmark = pytest.mark.integration


async def events_of(settings: ServiceSettings, checkpoint_id: str) -> list[dict[str, object]]:
    """The checkpoint's events on the stream, in stream order."""
    out = []
    for msg in await stream_messages(settings.nats_url, settings.events_stream):
        doc = json.loads(msg.data)
        if doc["data"].get("checkpoint_id") == checkpoint_id:
            out.append(doc)
    return out


async def watcher_pass(settings: ServiceSettings, root: Path) -> dict[str, str]:
    """One real writer-watcher pass over ``root``: folder → the checkpoint id it derived.

    The watcher keeps its state in Redis, so consecutive passes act as one long-lived watcher.
    """
    svc = build_watcher(
        WriterWatcherSettings.model_validate({**settings.model_dump(), "storage_root": str(root)})
    )
    await svc.bus.broker.start()
    try:
        await svc.watcher.scan_once()
    finally:
        await svc.bus.broker.stop()
        await svc.registry.close()
    assert svc.watcher.state is not None
    return {folder: t.checkpoint_id for folder, t in svc.watcher.state.folders.items()}


@pytest.fixture(autouse=True)
async def forget_watch_state(settings: ServiceSettings) -> AsyncIterator[None]:
    yield
    r = aioredis.Redis.from_url(settings.redis_url)
    keys = [k async for k in r.scan_iter(match=adapters.state_keys(settings.registry_prefix))]
    if keys:
        await r.delete(*keys)
    await r.aclose()


class PausingStore(FsStore):
    """A filesystem store that, just before the first array leaf is written, runs ``probe``."""

    def __init__(self, root: Path, probe: object) -> None:
        super().__init__(root)
        self.probe = probe
        self.seen: object = None

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        if "/state/" in key and self.seen is None:
            self.seen = asyncio.run(self.probe())  # type: ignore[operator]
        return super().put(key, data, metadata=metadata)


async def test_writing_precedes_the_shards_and_both_sources_agree(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    bus = sdk.BusEndpoint(
        settings.nats_url, prefix=settings.subject_prefix, job_key=job_key("job-a")
    )
    assert await watcher_pass(settings, tmp_path) == {}  # the streams are there, nothing seen

    async def probe() -> tuple[list[str], dict[str, str]]:
        # Runs in the SDK's thread, after the index is written and before any leaf is.
        on_stream = [
            m.subject for m in await stream_messages(settings.nats_url, settings.events_stream)
        ]
        return on_stream, await watcher_pass(settings, tmp_path)

    store = PausingStore(tmp_path, probe)
    state = {"w": np.arange(1000, dtype=np.float32), "opt": b"adam-state" * 10}
    saved = await asyncio.to_thread(
        sdk.save, store, "job-a", 12, state, run_id="run-3", project="nlp", bus=bus
    )
    assert saved.announced_writing
    assert saved.announced
    assert store.seen is not None
    on_stream, watched_while_writing = store.seen
    assert any(".checkpoint.writing." in s for s in on_stream), on_stream
    assert not any(".checkpoint.committed." in s for s in on_stream)
    assert watched_while_writing == {"job-a/step-00000012": saved.checkpoint_id}

    # After the commit the watcher reports the same checkpoint again: still one of each event.
    assert await watcher_pass(settings, tmp_path) == {"job-a/step-00000012": saved.checkpoint_id}
    events = await events_of(settings, saved.checkpoint_id)
    assert [e["type"] for e in events] == [
        "ckpt-ha.checkpoint.writing.v1",
        "ckpt-ha.checkpoint.committed.v1",
    ]
    assert all(e["source"] == "ckpt-ha/sdk" for e in events)  # the watcher's copies were dropped
    writing, committed = (e["data"] for e in events)
    assert writing["step"] == 12  # type: ignore[index]
    assert committed["identity"]["project"] == "nlp"  # type: ignore[index]
    assert committed["shard_count"] == 3  # type: ignore[index]


async def test_the_sdk_puts_writing_and_committed_in_one_trace(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    """Both announcements carry one W3C trace context, in the envelope and the NATS header, so
    everything the services do about the checkpoint joins that trace; and the watcher reporting
    the same save afterwards publishes nothing new (same ids) and keeps that trace in its state."""
    bus = sdk.BusEndpoint(
        settings.nats_url, prefix=settings.subject_prefix, job_key=job_key("job-t")
    )
    assert await watcher_pass(settings, tmp_path) == {}
    saved = await asyncio.to_thread(
        sdk.save, FsStore(tmp_path), "job-t", 3, {"w": b"x" * 64}, run_id="r", bus=bus
    )
    assert saved.announced_writing
    assert saved.announced
    msgs = [
        m
        for m in await stream_messages(settings.nats_url, settings.events_stream)
        if json.loads(m.data)["data"].get("checkpoint_id") == saved.checkpoint_id
    ]
    docs = [json.loads(m.data) for m in msgs]
    assert [d["type"] for d in docs] == [
        "ckpt-ha.checkpoint.writing.v1",
        "ckpt-ha.checkpoint.committed.v1",
    ]
    parents = {d["traceparent"] for d in docs}
    assert len(parents) == 1
    (traceparent,) = parents
    assert traceparent is not None
    assert [(m.headers or {}).get("traceparent") for m in msgs] == [traceparent, traceparent]
    # A second save is a second trace.
    other = await asyncio.to_thread(
        sdk.save, FsStore(tmp_path), "job-t", 4, {"w": b"y" * 64}, run_id="r", bus=bus
    )
    assert other.announced
    later = [
        json.loads(m.data)
        for m in await stream_messages(settings.nats_url, settings.events_stream)
        if json.loads(m.data)["data"].get("checkpoint_id") == other.checkpoint_id
    ]
    assert later
    assert later[0]["traceparent"].split("-")[1] != traceparent.split("-")[1]


async def test_watcher_alone_announces_with_the_identity_when_the_sdk_could_not(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    saved = sdk.save(str(tmp_path), "job-b", 1, {"w": b"x" * 64}, run_id="r", project="p")
    assert not saved.announced
    assert await watcher_pass(settings, tmp_path) == {"job-b/step-00000001": saved.checkpoint_id}
    [committed] = await events_of(settings, saved.checkpoint_id)
    assert committed["source"] == "ckpt-ha/writer-watcher"
    assert committed["data"]["identity"]["project"] == "p"  # type: ignore[index]
    assert committed["data"]["run_id"] == "r"  # type: ignore[index]


@pytest.fixture(scope="module")
def s3_store() -> Iterator[S3Store]:
    endpoint, stop = start_moto_server()
    client = s3_client(endpoint)
    bucket = f"sdk-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    yield S3Store(bucket, prefix="runs", client=client)
    stop()


def test_on_s3_the_watcher_derives_the_sdk_id_and_load_checks_shards(s3_store: S3Store) -> None:
    state = {"w": np.arange(64, dtype=np.int32), "meta": {"lr": 0.1, "names": ["a", "b"]}}
    saved = sdk.save(s3_store, "job-s3", 4, state, run_id="r")
    assert saved.uri == s3_store.uri("job-s3/step-00000004")
    [seen] = [o for o in adapters.scan(s3_store) if o.folder == "job-s3/step-00000004"]
    assert checkpoint_id(seen.folder, seen.first_written) == saved.checkpoint_id
    assert seen.evidence.identity == saved.manifest.identity

    loaded = sdk.load(s3_store, "job-s3/step-00000004")
    assert np.array_equal(loaded.state["w"], state["w"])
    assert loaded.state["meta"] == {"lr": 0.1, "names": ["a", "b"]}
    s3_store.put("job-s3/step-00000004/state/w.npy", b"\x00" * seen.files["state/w.npy"])
    with pytest.raises(sdk.CheckpointUnreadable, match="checksum"):
        sdk.load(s3_store, "job-s3/step-00000004")
