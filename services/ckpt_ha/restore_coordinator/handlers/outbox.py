"""What the coordinator publishes, stamped on its clock and in the current trace: decisions
(stored before they are published, re-published as stored), verdicts, quarantines, closures."""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_ha.contracts import CATALOG, Envelope, EventData, build
from ckpt_ha.restore_coordinator.ports import Clock, Publisher, RestoreState
from ckpt_ha.restore_coordinator.records import DecisionRecord
from ckpt_ha.telemetry import tracing

SOURCE = "ckpt-ha/restore-coordinator"


class Outbox:
    """The bus and the clock of every handler, and the one place a stored decision is marked
    published."""

    def __init__(self, bus: Publisher, clock: Clock, state: RestoreState) -> None:
        self.bus = bus
        self.clock = clock
        self.state = state

    def envelope(self, data: EventData, key: str) -> Envelope[EventData]:
        """In the current trace from the start: a decision is stored as it is published (and
        republished as is after a crash), so the stream holds what the state holds."""
        current = tracing.current_traceparent()
        traceparent, tracestate = current if current is not None else (None, None)
        return build(
            data,
            source=SOURCE,
            time=self.clock(),
            key=key,
            traceparent=traceparent,
            tracestate=tracestate,
        )

    async def publish(self, data: EventData, key: str) -> None:
        await self.bus.publish(self.envelope(data, key))

    async def publish_decision(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        """The stored decision's events, as stored (same ids), unless published already."""
        if decision.published:
            return
        await self.send(decision)
        await self.state.mark_published(job, attempt, decision)

    async def send(
        self, decision: DecisionRecord, built: Sequence[Envelope[EventData]] | None = None
    ) -> None:
        """Publish a stored decision's events in order, not marking it published (the caller
        does): ``built``, the envelopes it was stored from, saves decoding them again."""
        events = (
            built if built is not None else [CATALOG.decode(r.encode()) for r in decision.events]
        )
        for event in events:
            await self.bus.publish(event)

    async def send_many(
        self, decisions: Sequence[tuple[DecisionRecord, Sequence[Envelope[EventData]] | None]]
    ) -> list[Exception | None]:
        """`send` of many stored decisions (of different failures) at once, not marking them
        published: their first events published together (the acks awaited together), then
        the second events of those with two, and so on, so each decision's events land in
        order; a decision stops at its first event not stored. Each one's result, in order."""
        lists = [
            built if built is not None else [CATALOG.decode(r.encode()) for r in record.events]
            for record, built in decisions
        ]
        results: list[Exception | None] = [None] * len(lists)
        for k in range(max((len(events) for events in lists), default=0)):
            wave = [n for n, events in enumerate(lists) if k < len(events) and results[n] is None]
            sent = await self.bus.publish_many([lists[n][k] for n in wave])
            for n, result in zip(wave, sent, strict=True):
                results[n] = result
        return results

    async def publish_caused_by(
        self, event: Envelope[EventData], datas: Sequence[EventData]
    ) -> None:
        await self.bus.publish_caused_by(event, list(datas), source=SOURCE, time=self.clock())
