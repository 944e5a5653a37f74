"""When to scan storage again: on a change notification (inotify on a local filesystem) or, where
there is none (S3, or no inotify), when the poll interval is up.

A notification only wakes the watcher early; it never replaces the scan. The scan lists storage
and decides from what is there (level-triggered), so a lost or coalesced notification delays
detection by at most one poll interval and never changes a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Protocol

from ckpt_ha.storage import FsStore, ObjectStore

log = logging.getLogger("ckpt_ha.writer_watcher")


class Wakeup(Protocol):
    mode: str

    async def start(self) -> None: ...

    async def wait(self, interval_s: float) -> bool:
        """Return when storage may have changed (True) or after ``interval_s`` seconds (False)."""
        ...

    async def stop(self) -> None: ...


class Polling:
    """No notifications: wake up every poll interval."""

    mode = "poll"

    async def start(self) -> None:
        return None

    async def wait(self, interval_s: float) -> bool:
        await asyncio.sleep(interval_s)
        return False

    async def stop(self) -> None:
        return None


class Inotify:
    """Filesystem notifications for everything under ``root`` (inotify on Linux, through
    watchfiles), coalesced over ``debounce_ms`` so a checkpoint of many shards is one wakeup."""

    mode = "inotify"

    def __init__(self, root: Path, debounce_ms: int = 200) -> None:
        self.root = root
        self.debounce_ms = debounce_ms
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._pump())
        await asyncio.sleep(0)  # let the watch be set up before the first scan

    async def _pump(self) -> None:
        from watchfiles import awatch

        try:
            async for _changes in awatch(
                self.root,
                stop_event=self._stop,
                debounce=self.debounce_ms,
                watch_filter=None,
                force_polling=False,
            ):
                self._changed.set()
        except Exception as exc:  # noqa: BLE001 - fall back to polling; the scan still runs
            log.warning("change notifications stopped (%s); polling only", exc)

    async def wait(self, interval_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), interval_s)
        changed = self._changed.is_set()
        self._changed.clear()
        return changed

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def for_store(store: ObjectStore, mode: str) -> Wakeup:
    """``auto``: inotify for a local filesystem root, polling otherwise (S3); ``poll``: always
    poll; ``inotify``: insist (a configuration error on S3)."""
    if mode == "poll":
        return Polling()
    if isinstance(store, FsStore):
        return Inotify(store.root)
    if mode == "inotify":
        raise ValueError(f"change notifications need a local filesystem root, not {store.uri('')}")
    return Polling()
