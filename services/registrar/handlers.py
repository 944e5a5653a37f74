"""Registrar handlers: project checkpoint events into the registry, announce the results."""

from __future__ import annotations

from contracts import Envelope, EventData
from services.registrar import domain
from services.shared.bus import Bus
from services.shared.clock import Clock
from services.shared.lifecycle import IllegalTransition
from services.shared.metrics import LifecycleMetrics, ServiceMetrics
from services.shared.registry import Applied, Registry

SOURCE = "ckpt-ha/registrar"


class RegistrarHandlers:
    def __init__(
        self,
        registry: Registry,
        bus: Bus,
        metrics: ServiceMetrics,
        clock: Clock,
        lifecycle: LifecycleMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.bus = bus
        self.metrics = metrics
        self.clock = clock
        self.lifecycle = lifecycle or LifecycleMetrics(metrics)

    async def on_checkpoint_events(
        self, events: list[Envelope[EventData]]
    ) -> list[BaseException | None]:
        """Project a batch in stream order; report each event's own outcome."""
        outcomes: list[BaseException | None] = []
        for event, result in zip(events, await self.registry.apply_many(events), strict=True):
            try:
                if isinstance(result, IllegalTransition):
                    await self._publish(event, [domain.conflict(event, result)])
                if isinstance(result, Exception):
                    outcomes.append(result)
                    continue
                self._observe(event, result)
                await self._publish(event, domain.follow_ups(event, result))
                outcomes.append(None)
            except Exception as exc:  # noqa: BLE001 - a failed publish naks just this event
                outcomes.append(exc)
        return outcomes

    def _observe(self, event: Envelope[EventData], result: Applied) -> None:
        """Metrics of one applied event (a duplicate or a no-op repeat counts nothing)."""
        step = result.transition
        if step is None or not step.changed:
            return
        self.metrics.transitions.labels(
            self.metrics.service, step.previous or "none", step.new
        ).inc()
        self.lifecycle.observe(event, result)

    async def _publish(self, cause: Envelope[EventData], datas: list[EventData]) -> None:
        await self.bus.publish_caused_by(cause, datas, source=SOURCE, time=self.clock())
