"""Registrar handlers: project checkpoint events into the registry, announce the results."""

from __future__ import annotations

from contracts import Envelope, EventData
from contracts.checkpoint import CheckpointVerifiedV1
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
                step = result.transition
                if step is not None and step.changed:
                    self.metrics.transitions.labels(
                        self.metrics.service, step.previous or "none", step.new
                    ).inc()
                tier = None
                if isinstance(event.data, CheckpointVerifiedV1) and result.record is not None:
                    tier = (await self.registry.tier_of(event.data.job_id)).tier.name
                await self._publish(event, domain.follow_ups(event, result, tier))
                outcomes.append(None)
            except Exception as exc:  # noqa: BLE001 - a failed publish naks just this event
                outcomes.append(exc)
        return outcomes

    async def _publish(self, cause: Envelope[EventData], datas: list[EventData]) -> None:
        await self.bus.publish_caused_by(cause, datas, source=SOURCE, time=self.clock())
