"""Replace the registry with a rebuild from the event stream (the registry is only a projection
of it). Refused on a registry that holds anything unless the operator asked to clear it."""

from __future__ import annotations

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG, EventCatalog
from ckpt_ha.ops.errors import RegistryNotEmpty
from ckpt_ha.registrar.rebuild import RebuildReport, rebuild
from ckpt_ha.registry.redis_registry import Registry


async def rebuild_registry(
    registry: Registry, bus: BusConfig, *, clear: bool, catalog: EventCatalog = CATALOG
) -> RebuildReport:
    if await registry.dump():
        if not clear:
            raise RegistryNotEmpty
        await registry.clear()
    return await rebuild(registry, bus, catalog)
