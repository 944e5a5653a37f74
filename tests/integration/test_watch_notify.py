"""Change notifications on a real local filesystem wake the watcher early; elsewhere it polls."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.formats import native
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from ckpt_ha.writer_watcher.app import build as build_watcher
from ckpt_ha.writer_watcher.notify import Inotify, Polling, for_store
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings
from tests.support.bus_tools import stream_messages, wait_for

pytestmark = pytest.mark.integration


async def test_a_write_under_the_root_wakes_the_watcher(tmp_path: Path) -> None:
    feed = Inotify(tmp_path, debounce_ms=50)
    await feed.start()
    try:
        assert await feed.wait(0.3) is False  # nothing happened: the poll interval runs out
        (tmp_path / "job" / "step-1").mkdir(parents=True)
        await asyncio.sleep(0.2)
        await feed.wait(0.5)  # the mkdir itself may be one wakeup
        started = time.monotonic()
        writer = asyncio.create_task(
            asyncio.to_thread((tmp_path / "job" / "step-1" / "shard-0.bin").write_bytes, b"x")
        )
        assert await feed.wait(30) is True
        assert time.monotonic() - started < 10  # woken by the write, not by the 30 s timeout
        await writer
    finally:
        await feed.stop()


async def test_mode_selection(tmp_path: Path) -> None:
    assert isinstance(for_store(FsStore(tmp_path), "auto"), Inotify)
    assert isinstance(for_store(FsStore(tmp_path), "poll"), Polling)
    poll = Polling()
    started = time.monotonic()
    assert await poll.wait(0.1) is False
    assert time.monotonic() - started >= 0.1


async def test_the_watcher_announces_a_commit_long_before_its_poll_interval(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    s = {**settings.model_dump(), "storage_root": str(root), "poll_interval_s": 120.0}
    svc = build_watcher(WriterWatcherSettings.model_validate(s))
    assert svc.app is not None
    await svc.app.start()
    try:
        await asyncio.sleep(0.5)  # the first scan (of an empty root) is done
        started = time.monotonic()
        native.write(
            FsStore(root),
            "job-n/step-1",
            {"a.bin": b"x" * 100},
            step=1,
            created_at=datetime.now(UTC),
        )

        async def committed() -> list[Any]:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            return [m for m in msgs if ".checkpoint.committed." in m.subject]

        await wait_for(committed, timeout=30, what="committed, woken by inotify")
        assert time.monotonic() - started < 30  # the poll alone would take 120 s
    finally:
        await svc.app.stop()
        await svc.registry.close()
