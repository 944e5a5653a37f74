"""A `Publisher` that stands in for the registrar: it records what an operation published and
projects each event into a real `Registry` at once, as the registrar would after consuming it.
Operations that publish and then wait for the registry run without NATS."""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.registry.redis_registry import Registry
from tests.support.fakes.publisher import RecordingPublisher


class ProjectingPublisher(RecordingPublisher):
    def __init__(self, registry: Registry) -> None:
        super().__init__()
        self.registry = registry

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        await super().publish(event)
        await self.registry.apply(event)
        return event
