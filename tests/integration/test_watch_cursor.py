"""The watcher's listing cursor on real storage: inotify names the folder that changed and only
that one is listed and read; a change whose notification was lost is found by the next full
listing; on S3 (moto's server) each poll is one listing and reads only the folders that changed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.storage import S3Store
from ckpt_ha.writer_watcher.notify import Inotify
from tests.support.moto_server import s3_client, start_moto_server
from tests.support.watch_cursor import (
    FAILED,
    FULL,
    T0,
    Clock,
    CountingStore,
    published,
    watcher,
    write,
)

pytestmark = pytest.mark.integration


async def named_soon(feed: Inotify) -> None:
    """Until the feed has been notified of something (bounded: the test fails, never hangs)."""
    assert await feed.wait(30), "no change notification within 30 s"


async def test_inotify_names_the_changed_folder_and_a_lost_one_waits_for_the_full_listing(
    tmp_path: Path,
) -> None:
    store = CountingStore(tmp_path)
    for i in range(3):
        write(store, f"job-a/step-{i}", i)
    clock = Clock()
    w = watcher(store, clock)
    feed = Inotify(tmp_path, debounce_ms=50)
    await feed.start()
    w.changes = feed
    try:
        await w.scan_once()
        assert w.last_scan is not None
        assert w.last_scan.full
        assert w.last_scan.read == 3
        store.take()

        (tmp_path / "job-a/step-1/rank-1.bin").unlink()
        await named_soon(feed)
        clock.now += timedelta(seconds=2)
        await w.scan_once()
        assert w.last_scan is not None
        assert not w.last_scan.full
        reads, listings = store.take()
        assert listings == ["job-a/step-1/"]
        assert reads == ["job-a/step-1"]
        assert published(w)[-1] == (FAILED, published(w)[1][1])

        # A notification lost (as in a queue overflow): taken from the feed, never scanned.
        (tmp_path / "job-a/step-2/rank-1.bin").unlink()
        await named_soon(feed)
        assert feed.changed() == {"job-a/step-2"}
        clock.now += timedelta(seconds=2)
        await w.scan_once()
        assert w.last_scan is not None
        assert not w.last_scan.full
        assert w.last_scan.read == 0
        assert len(published(w)) == 4

        clock.now = T0 + FULL  # the first full listing ran at T0
        await w.scan_once()
        assert w.last_scan is not None
        assert w.last_scan.full
        assert w.last_scan.read == 1
        assert published(w)[-1] == (FAILED, published(w)[2][1])
    finally:
        await feed.stop()


@pytest.fixture
def s3_root() -> Iterator[tuple[S3Store, list[str]]]:
    """An S3Store on a fresh bucket of a moto server, and the S3 operations it sent."""
    endpoint, stop = start_moto_server()
    client = s3_client(endpoint)
    bucket = f"watch-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    calls: list[str] = []

    def record(model: Any, **_: Any) -> None:
        calls.append(model.name)

    client.meta.events.register("before-call.s3.*", record)
    try:
        yield S3Store(bucket, prefix="ckpt", client=client), calls
    finally:
        stop()


async def test_each_s3_poll_is_one_listing_and_reads_only_changed_folders(
    s3_root: tuple[S3Store, list[str]],
) -> None:
    store, calls = s3_root
    for i in range(3):
        write(store, f"job-a/step-{i}", i)  # type: ignore[arg-type]
    clock = Clock()
    w = watcher(store, clock)  # type: ignore[arg-type]
    calls.clear()
    await w.scan_once()
    assert calls.count("ListObjectsV2") == 1
    assert calls.count("GetObject") == 3  # each manifest, once
    assert len(published(w)) == 3

    calls.clear()
    clock.now += timedelta(seconds=2)
    await w.scan_once()
    assert calls == ["ListObjectsV2"]  # nothing changed: one listing, no read

    store.delete("job-a/step-0/rank-1.bin")
    calls.clear()
    clock.now += timedelta(seconds=2)
    await w.scan_once()
    assert calls == ["ListObjectsV2", "GetObject"]  # the changed folder's manifest only
    assert published(w)[-1] == (FAILED, published(w)[0][1])
