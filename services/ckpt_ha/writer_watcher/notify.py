"""When to scan storage again: on a change notification (inotify on a local filesystem) or, where
there is none (S3, or no inotify), when the poll interval is up.

A notification wakes the watcher early and names the folder it is about (`Inotify.changed`):
the next scan lists and reads only the folders named (and those read on every scan), and a full
listing still runs every ``full_rescan_interval_s`` and whenever the feed cannot say what
changed (it stopped, or named the root itself). The scan decides from what is there
(level-triggered), so a lost or overflowed notification delays detection by at most the
full-rescan interval and never changes a decision.
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

    def changed(self) -> frozenset[str] | None:
        """`ports.ChangeFeed.changed`."""
        ...

    async def start(self) -> None: ...

    async def wait(self, interval_s: float) -> bool:
        """Return when storage may have changed (True) or after ``interval_s`` seconds (False)."""
        ...

    async def stop(self) -> None: ...


class Polling:
    """No notifications: wake up every poll interval."""

    mode = "poll"

    def changed(self) -> frozenset[str] | None:
        return None  # no feed: every scan lists the whole root

    async def start(self) -> None:
        return None

    async def wait(self, interval_s: float) -> bool:
        await asyncio.sleep(interval_s)
        return False

    async def stop(self) -> None:
        return None


MAX_NAMED = 10_000
"""More folders changed than this between two scans: the next one lists the whole root (one
walk is cheaper than as many separate listings, and the set stays bounded)."""


def folder_of(root: Path, path: str) -> str | None:
    """The ``<job>/<folder>`` (or ``<job>``) a changed ``path`` under ``root`` belongs to; None
    when that cannot be said (the root itself, or a path outside it)."""
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:
        return None
    if not parts:
        return None
    return "/".join(parts[:2])


class Inotify:
    """Filesystem notifications for everything under ``root`` (inotify on Linux, through
    watchfiles), coalesced over ``debounce_ms`` so a checkpoint of many shards is one wakeup.
    Which folders they were about is kept until the next scan asks (`changed`)."""

    mode = "inotify"

    def __init__(self, root: Path, debounce_ms: int = 200) -> None:
        self.root = root
        self.debounce_ms = debounce_ms
        self._named: set[str] = set()
        self._unknown = True
        """The feed cannot say what changed since the last call (not started, stopped,
        overflowed): the next scan lists everything."""
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._pump())
        await asyncio.sleep(0)  # let the watch be set up before the first scan

    async def _pump(self) -> None:
        from watchfiles import awatch

        root = self.root.absolute()
        try:
            async for batch in awatch(
                self.root,
                stop_event=self._stop,
                debounce=self.debounce_ms,
                watch_filter=None,
                force_polling=False,
            ):
                for _change, path in batch:
                    folder = folder_of(root, path)
                    if folder is None or len(self._named) >= MAX_NAMED:
                        self._unknown = True
                    else:
                        self._named.add(folder)
                self._changed.set()
        except Exception as exc:  # noqa: BLE001 - fall back to polling; the scan still runs
            log.warning("change notifications stopped (%s); polling only", exc)
        self._stopped = True

    def changed(self) -> frozenset[str] | None:
        """The folders named since the last call; None when the feed cannot say (the first
        call, a change at the root itself, too many changes, notifications stopped)."""
        if self._unknown or self._stopped:
            self._unknown = False
            self._named.clear()
            return None
        named = frozenset(self._named)
        self._named.clear()
        return named

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
