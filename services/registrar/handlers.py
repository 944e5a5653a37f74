"""Registrar handlers: project checkpoint events into the registry, announce the results."""

from __future__ import annotations

from contracts import Envelope, EventData, build
from contracts.checkpoint import CheckpointEvent
from services.registrar import domain
from services.shared.bus import Bus
from services.shared.clock import Clock
from services.shared.lifecycle import IllegalTransition
from services.shared.metrics import ServiceMetrics
from services.shared.registry import Registry

SOURCE = "ckpt-ha/registrar"


class RegistrarHandlers:
    def __init__(self, registry: Registry, bus: Bus, metrics: ServiceMetrics, clock: Clock) -> None:
        self.registry = registry
        self.bus = bus
        self.metrics = metrics
        self.clock = clock

    async def on_checkpoint_event(self, event: CheckpointEvent) -> None:
        try:
            applied = await self.registry.apply(event)
        except IllegalTransition as exc:
            await self._publish(event, [domain.conflict(event, exc)])
            raise
        step = applied.transition
        if step is not None and step.changed:
            self.metrics.transitions.labels(
                self.metrics.service, step.previous or "none", step.new
            ).inc()
        await self._publish(event, domain.follow_ups(event, applied.record))

    async def _publish(self, cause: Envelope[EventData], datas: list[EventData]) -> None:
        for data in datas:
            await self.bus.publish(
                build(
                    data,
                    source=SOURCE,
                    time=self.clock(),
                    key=cause.id,
                    traceparent=cause.traceparent,
                    tracestate=cause.tracestate,
                )
            )
