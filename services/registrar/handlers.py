"""Registrar handlers: project checkpoint events into the registry, announce the results."""

from __future__ import annotations

from contracts import Envelope, EventData
from contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointWriteFailedV1,
)
from services.registrar import domain
from services.shared.bus import Bus
from services.shared.clock import Clock
from services.shared.lifecycle import IllegalTransition
from services.shared.metrics import LifecycleMetrics, ServiceMetrics, reason_class
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
        step, record = result.transition, result.record
        if step is None or not step.changed or record is None:
            return
        m, service = self.lifecycle, self.metrics.service
        self.metrics.transitions.labels(service, step.previous or "none", step.new).inc()
        m.states.labels(service, step.new, record.format).inc()
        job, at = record.job_id, event.time.timestamp()
        if step.new == CheckpointState.WRITING:
            m.write_opened(job, record.checkpoint_id, at)
        else:
            m.write_closed(job, record.checkpoint_id)
        if step.new == CheckpointState.VALID:
            m.last_valid.set_max(job, value=record.created_at.timestamp())
        data = event.data
        corrupt: str | None = None
        if isinstance(data, CheckpointWriteFailedV1):
            why = reason_class(data.reason)
            m.write_failures.labels(service, data.side, why).inc()
            m.last_write_failure.set(job, data.side, why, value=at)
        elif isinstance(data, CheckpointCorruptV1):
            corrupt = data.reason
            m.corrupt.labels(service, reason_class(data.reason), data.side).inc()
        elif isinstance(data, CheckpointQuarantinedV1):
            m.quarantined.labels(service, "manual" if data.actor else "automatic").inc()
            if step.previous == CheckpointState.VALID and not data.actor:
                # A failed load or scrub found a valid checkpoint damaged: corrupt as well.
                corrupt = data.reason
                m.corrupt.labels(service, reason_class(data.reason), "unknown").inc()
        if corrupt is not None:
            m.last_corrupt_at.set(job, value=at)
            m.last_corrupt_step.set(job, value=record.step if record.step is not None else -1)

    async def _publish(self, cause: Envelope[EventData], datas: list[EventData]) -> None:
        await self.bus.publish_caused_by(cause, datas, source=SOURCE, time=self.clock())
