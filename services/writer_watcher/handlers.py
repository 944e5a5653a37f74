"""The watcher's loop: list storage, advance the domain state, publish what it decided."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from contracts import build
from services.shared.bus import Bus
from services.shared.clock import Clock
from services.shared.storage import ObjectStore, StorageError
from services.writer_watcher import adapters, domain

SOURCE = "ckpt-ha/writer-watcher"
log = logging.getLogger("ckpt_ha.writer_watcher")


class Watcher:
    def __init__(self, store: ObjectStore, bus: Bus, clock: Clock, stall_after: timedelta) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.stall_after = stall_after
        self.state = domain.WatchState()

    async def scan_once(self) -> int:
        """One pass; returns how many events were published."""
        observations = await asyncio.to_thread(lambda: list(adapters.scan(self.store)))
        # Decide on a copy; keep it only once every event is published, so a failed publish
        # is decided (and, with its deterministic id, deduplicated) again on the next pass.
        state = domain.WatchState(dict(self.state.folders))
        events = domain.observe(state, observations, self.clock(), self.stall_after)
        for data in events:
            key = f"{data.EVENT_TYPE}|{data.subject_key()}"
            await self.bus.publish(build(data, source=SOURCE, time=self.clock(), key=key))
        self.state = state
        return len(events)

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.scan_once()
            except StorageError as exc:  # an outage delays detection; it decides nothing
                log.warning("storage scan failed, retrying: %s", exc)
            await asyncio.sleep(interval_s)
