"""Rebuild the registry from the event stream (the registry is only a projection of it).

Replays every checkpoint event in stream order through the same `Registry.apply` the live
registrar uses. Events the live consumer dead-lettered fail here the same way and are skipped;
an event that arrived before the one it depends on (which the live consumer nak'ed and retried)
is deferred and retried after the rest, as redelivery did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import nats
from nats.js.api import DeliverPolicy

from contracts import Envelope, EventCatalog, EventData
from contracts.errors import ContractError
from contracts.subjects import aggregate_filter
from services.shared.bus_config import BusConfig
from services.shared.errors import DependencyNotReady
from services.shared.lifecycle import IllegalTransition
from services.shared.registry import Registry


@dataclass
class RebuildReport:
    read: int = 0
    applied: int = 0
    duplicates: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, code: str) -> None:
        self.skipped[code] = self.skipped.get(code, 0) + 1


async def read_checkpoint_events(
    cfg: BusConfig, catalog: EventCatalog, report: RebuildReport, idle_timeout: float = 5.0
) -> list[Envelope[EventData]]:
    """Every decodable checkpoint event in the stream, in stream order."""
    nc = await nats.connect(
        cfg.url, user=cfg.user, password=cfg.password, connect_timeout=5, max_reconnect_attempts=2
    )
    events: list[Envelope[EventData]] = []
    try:
        js = nc.jetstream()
        info = await js.stream_info(cfg.events_stream)
        if info.state.messages == 0:
            return events
        sub = await js.subscribe(
            aggregate_filter(cfg.prefix, "checkpoint"),
            stream=cfg.events_stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=idle_timeout)
                except TimeoutError:
                    break  # no checkpoint events at all, or the stream ended
                report.read += 1
                try:
                    events.append(catalog.decode(msg.data))
                except ContractError as exc:
                    report.skip(exc.code)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    return events


async def rebuild(registry: Registry, cfg: BusConfig, catalog: EventCatalog) -> RebuildReport:
    report = RebuildReport()
    pending = await read_checkpoint_events(cfg, catalog, report)
    while pending:
        deferred: list[Envelope[EventData]] = []
        for event in pending:
            try:
                result = await registry.apply(event)
            except DependencyNotReady:
                deferred.append(event)
                continue
            except IllegalTransition as exc:
                report.skip(exc.code)
                continue
            if result.duplicate:
                report.duplicates += 1
            else:
                report.applied += 1
        if len(deferred) == len(pending):
            for _ in deferred:
                report.skip(DependencyNotReady.code)
            break
        pending = deferred
    return report
