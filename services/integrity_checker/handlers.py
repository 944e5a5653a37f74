"""Integrity-checker handler: verify a committed checkpoint on storage, publish the verdict."""

from __future__ import annotations

import asyncio

from contracts import Envelope
from contracts.checkpoint import CheckpointCommittedV1
from services.integrity_checker import domain
from services.shared.bus import Bus
from services.shared.clock import Clock
from services.shared.errors import PermanentError
from services.shared.formats import verify
from services.shared.storage import ObjectStore, key_for_uri

SOURCE = "ckpt-ha/integrity-checker"


class OutsideStorageRoot(PermanentError):
    code = "outside_storage_root"

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(f"{uri} is not under this checker's storage root")


class IntegrityHandlers:
    def __init__(self, store: ObjectStore, bus: Bus, clock: Clock, algorithm: str) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.algorithm = algorithm

    async def on_committed(self, event: Envelope[CheckpointCommittedV1]) -> None:
        key = key_for_uri(self.store, event.data.uri)
        if key is None:
            raise OutsideStorageRoot(event.data.uri)
        # Reading shards is blocking I/O: off the event loop (in-progress acks keep flowing).
        report = await asyncio.to_thread(verify, self.store, key, self.algorithm)
        await self.bus.publish_caused_by(
            event, domain.outcome(event.data, report), source=SOURCE, time=self.clock()
        )
