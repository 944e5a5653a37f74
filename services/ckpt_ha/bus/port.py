"""What a handler needs from the bus: publish events. The one port every service's handlers
take instead of the concrete `Bus`, so handler logic runs against an in-memory fake in unit
tests and against a real nats-server in integration tests.

Invariant (both `Bus` and the test fake keep it): an event is identified by its ``event_id``;
publishing the same envelope twice is deduplicated (JetStream's ``Nats-Msg-Id``), so a handler
that is redelivered may publish its follow-ups again without creating new facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from ckpt_ha.contracts import Envelope, EventData


class Publisher(Protocol):
    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        """Publish one envelope into the event stream; returns it as published (with the trace
        context it was given)."""
        ...

    async def publish_many(self, events: Sequence[Envelope[EventData]]) -> list[Exception | None]:
        """Publish envelopes at once (their acks awaited together); each one's result, in
        order: None once stored, else its error. Their order in the stream is not promised:
        events that must land in order go in successive calls."""
        ...

    async def publish_caused_by(
        self,
        cause: Envelope[EventData],
        datas: Sequence[EventData],
        *,
        source: str,
        time: datetime,
        key: str | None = None,
    ) -> None:
        """Publish the follow-ups of ``cause`` with ids derived from it (a redelivered cause
        yields the same ids) and its trace carried on. ``key``: what the ids derive from
        instead of the cause's id, when two causes announce one fact (one commit announced by
        the writer and by the watcher: one verdict)."""
        ...
