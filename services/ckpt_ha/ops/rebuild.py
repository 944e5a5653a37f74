"""Rebuild the registry from the event stream (the registry is only a projection of it).

An operation (not part of the registry package): it reads the bus, which sits above the
registry in the import layers.

Refuses (`StreamIncomplete`) a stream that no longer starts at sequence 1. Replays every
checkpoint event in stream order through the same projection the live registrar
uses (any `RegistryWriter`: the Redis adapter, or the in-memory fake in tests), after the same
intake check (a location its job does not own is refused). Events the live consumer
dead-lettered fail here the same way and are skipped;
an event that arrived before the one it depends on (which the live consumer nak'ed and retried)
is deferred and retried after the rest, as redelivery did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG, Envelope, EventCatalog, EventData
from ckpt_ha.contracts.subjects import aggregate_filter
from ckpt_ha.core.errors import DependencyNotReady, PermanentError
from ckpt_ha.core.locations import KeyOf, intake_refusal
from ckpt_ha.ops.errors import RegistryNotEmpty
from ckpt_ha.ops.streams import require_complete_stream
from ckpt_ha.registry.port import RegistryWriter
from ckpt_ha.registry.redis_registry import Registry


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
    events, read = await read_events(
        cfg,
        catalog,
        aggregate_filter(cfg.prefix, "checkpoint"),
        idle_timeout=idle_timeout,
        on_undecodable=report.skip,
    )
    report.read += read
    return events


async def rebuild(
    registry: RegistryWriter, cfg: BusConfig, catalog: EventCatalog, key_of: KeyOf
) -> RebuildReport:
    """``key_of``: a location's key in the storage root, as the live registrar had it (an event
    naming a location its job does not own is refused here as it was there). Refuses
    (`StreamIncomplete`) a stream whose first events are gone."""
    await require_complete_stream(cfg)
    return await _replay(registry, cfg, catalog, key_of)


async def _replay(
    registry: RegistryWriter, cfg: BusConfig, catalog: EventCatalog, key_of: KeyOf
) -> RebuildReport:
    report = RebuildReport()
    pending = await read_checkpoint_events(cfg, catalog, report)
    pending = [e for e in pending if not _refused(e, key_of, report)]
    while pending:
        deferred: list[Envelope[EventData]] = []
        for event in pending:
            try:
                result = await registry.apply(event)
            except DependencyNotReady:
                deferred.append(event)
                continue
            except PermanentError as exc:
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


def _refused(event: Envelope[EventData], key_of: KeyOf, report: RebuildReport) -> bool:
    refused = intake_refusal(event.data, key_of)
    if refused is not None:
        report.skip(refused.code)
    return refused is not None


async def rebuild_registry(
    registry: Registry,
    bus: BusConfig,
    key_of: KeyOf,
    *,
    clear: bool,
    catalog: EventCatalog = CATALOG,
) -> RebuildReport:
    await require_complete_stream(bus)  # before anything is cleared
    if await registry.dump():
        if not clear:
            raise RegistryNotEmpty
        await registry.clear()
    return await _replay(registry, bus, catalog, key_of)
