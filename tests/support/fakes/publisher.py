"""A recording `Publisher`: keeps what a handler published, deduplicated on the event id as
JetStream deduplicates on ``Nats-Msg-Id``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ckpt_ha.contracts import Envelope, EventData, build


class RecordingPublisher:
    def __init__(self) -> None:
        self.events: list[Envelope[EventData]] = []
        self._ids: set[str] = set()

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        if event.id not in self._ids:
            self._ids.add(event.id)
            self.events.append(event)
        return event

    async def publish_many(self, events: Sequence[Envelope[EventData]]) -> list[Exception | None]:
        for event in events:
            await self.publish(event)
        return [None] * len(events)

    async def publish_caused_by(
        self,
        cause: Envelope[EventData],
        datas: Sequence[EventData],
        *,
        source: str,
        time: datetime,
        key: str | None = None,
    ) -> None:
        for data in datas:
            await self.publish(
                build(
                    data,
                    source=source,
                    time=time,
                    key=key or cause.id,
                    traceparent=cause.traceparent,
                    tracestate=cause.tracestate,
                )
            )

    def of_type(self, event_type: str) -> list[Envelope[EventData]]:
        return [e for e in self.events if e.event_type == event_type]

    def types(self) -> list[str]:
        return [e.event_type for e in self.events]
