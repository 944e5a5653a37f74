"""The job index's consumers: every event of the event stream (a checkpoint's is skipped: the
registry has those) and the progress stream's reports, recorded in the index
(`ckpt_ha.restore_coordinator.store.job_index`) a fetched batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ckpt_ha.contracts import Envelope, EventData


class JobIndexWriter(Protocol):
    async def record(self, events: Sequence[Envelope[EventData]]) -> None: ...


class JobIndexing:
    def __init__(self, index: JobIndexWriter) -> None:
        self.index = index

    async def on_batch(self, batch: list[Envelope[EventData]]) -> list[BaseException | None]:
        """Index a fetched batch (stream order) in a few round trips; a Redis failure fails
        the batch, whose events come again (an event indexed already keeps its place)."""
        await self.index.record(batch)
        return [None] * len(batch)
