"""An in-memory watch state (`ckpt_ha.writer_watcher.ports.WatchStateStore`).

Instances opened on one `WatchStateBackend` with the same root share what was saved, as
watchers restarting on one Redis do; another root's state is separate.
"""

from __future__ import annotations

import dataclasses

from ckpt_ha.writer_watcher.domain import Tracked, WatchState
from ckpt_ha.writer_watcher.ports import WatchStateUnavailable


class WatchStateBackend:
    """What survives a watcher restart: root URI → folder → tracked entry."""

    def __init__(self) -> None:
        self.roots: dict[str, dict[str, Tracked]] = {}
        self.down = False
        """Set to make loads and saves raise `WatchStateUnavailable` (an outage)."""
        self.saves = 0

    def open(self, root_uri: str) -> InMemoryWatchState:
        return InMemoryWatchState(self, root_uri)


class InMemoryWatchState:
    def __init__(self, backend: WatchStateBackend, root_uri: str) -> None:
        self.backend = backend
        self.root_uri = root_uri

    def _check(self) -> None:
        if self.backend.down:
            raise WatchStateUnavailable("the in-memory watch state is down (test)")

    async def load(self) -> WatchState:
        self._check()
        return WatchState(dict(self.backend.roots.get(self.root_uri, {})))

    async def save(self, state: WatchState) -> None:
        self._check()
        # Tracked is frozen; copying the mapping is enough for the caller's later edits.
        self.backend.roots[self.root_uri] = {
            folder: dataclasses.replace(tracked) for folder, tracked in state.folders.items()
        }
        self.backend.saves += 1
