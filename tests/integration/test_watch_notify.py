"""Change notifications on a real local filesystem wake the watcher early; elsewhere it polls."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.shared.storage import FsStore
from services.writer_watcher.notify import Inotify, Polling, for_store

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
