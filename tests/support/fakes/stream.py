"""`StoredEvents` in memory: what a test put in the event stream, read back newest first."""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData


class InMemoryStream:
    def __init__(self) -> None:
        self.events: list[Envelope[EventData]] = []
        """In stream order, oldest first."""
        self.reads = 0
        """How many times `last_event` was asked."""

    def add(self, *events: Envelope[EventData]) -> None:
        self.events.extend(events)

    async def last_event(self, event_type: str, job_id: str) -> Envelope[EventData] | None:
        self.reads += 1
        for event in reversed(self.events):
            if event.event_type == event_type and event.data.job_id == job_id:
                return event
        return None
