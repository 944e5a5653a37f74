"""Registrar handlers: project checkpoint events into the registry, announce the results.

Fetch and persist are one step here (the registry projects and writes a batch atomically) →
decide the follow-ups (`domain`) → publish. Every dependency is a port (`registrar.ports`).
"""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointCorruptV1, CheckpointQuarantinedV1
from ckpt_ha.core.locations import KeyOf
from ckpt_ha.core.records import Applied
from ckpt_ha.registrar import domain
from ckpt_ha.registrar.metrics import LifecycleMetrics
from ckpt_ha.registrar.ports import Clock, Publisher, RegistrarRegistry
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import ServiceMetrics

SOURCE = "ckpt-ha/registrar"


class RegistrarHandlers:
    def __init__(
        self,
        registry: RegistrarRegistry,
        publisher: Publisher,
        metrics: ServiceMetrics,
        clock: Clock,
        lifecycle: LifecycleMetrics | None = None,
        *,
        key_of: KeyOf,
    ) -> None:
        self.key_of = key_of
        """A location's key in the storage root: whose it is decides what may be registered."""
        self.registry = registry
        self.publisher = publisher
        self.metrics = metrics
        self.clock = clock
        self.lifecycle = lifecycle or LifecycleMetrics(metrics)

    async def on_checkpoint_events(
        self, events: list[Envelope[EventData]]
    ) -> list[BaseException | None]:
        """Project a batch in stream order; report each event's own outcome. An event naming a
        location its job does not own is refused before the registry sees it."""
        outcomes: list[BaseException | None] = []
        refused = [domain.refusal(event, self.key_of) for event in events]
        taken = [event for event, why in zip(events, refused, strict=True) if why is None]
        with tracing.span(
            "registry.apply_many",
            attributes={"db.system": "redis", "ckpt_ha.batch_size": len(taken)},
        ):
            applied = iter(await self.registry.apply_many(taken) if taken else [])
        results = [why if why is not None else next(applied) for why in refused]
        recording = tracing.recording()
        for event, result in zip(events, results, strict=True):
            if not recording and not isinstance(result, Exception) and self._quiet(event, result):
                # Most events: applied, nothing to announce, no span to record. Only the
                # metrics move; entering the checkpoint's trace context would change nothing.
                self._observe(event, result)
                outcomes.append(None)
                continue
            # One span per event in the checkpoint's trace (the batch's own span is a root
            # linking all of them): what the registry decided for this event.
            with tracing.continue_trace(
                f"registrar {event.event_type}",
                event.traceparent,
                tracestate=event.tracestate,
                attributes=tracing.event_attributes(event) if recording else None,
                link_origin=False,
            ):
                outcomes.append(await self._settle(event, result))
        return outcomes

    async def _settle(
        self, event: Envelope[EventData], result: Applied | Exception
    ) -> BaseException | None:
        try:
            if isinstance(result, domain.REPORTED):
                tracing.fail(str(result), code=result.code)
                await self._publish(event, [domain.conflict(event, result)])
            if isinstance(result, Exception):
                tracing.annotate(**{"ckpt_ha.error": repr(result)[:500]})
                return result
            step = result.transition
            if step is not None and step.changed:
                tracing.annotate(
                    **{"ckpt_ha.state.previous": step.previous, "ckpt_ha.state": step.new}
                )
            self._observe(event, result)
            if isinstance(event.data, CheckpointCorruptV1 | CheckpointQuarantinedV1):
                tracing.fail(event.data.reason, code=event.data.EVENT_TYPE)
            tier = None
            if domain.announces_registration(event, result):
                tier = (await self.registry.tier_of(event.data.job_id)).tier.name
            await self._publish(event, domain.follow_ups(event, result, tier))
        except Exception as exc:  # noqa: BLE001 - a failed publish naks just this event
            return exc
        return None

    def _observe(self, event: Envelope[EventData], result: Applied) -> None:
        """The metrics of an applied event: its transition, when it made one."""
        step = result.transition
        if step is not None and step.changed:
            self.metrics.transition(step.previous or "none", step.new)
            self.lifecycle.observe(event, result)

    @staticmethod
    def _quiet(event: Envelope[EventData], result: Applied) -> bool:
        """Whether settling an applied event only counts it: not a verdict that fails a span,
        and announcing nothing (no registration, conflict or fence to publish)."""
        return (
            not isinstance(event.data, CheckpointCorruptV1 | CheckpointQuarantinedV1)
            and not domain.announces_registration(event, result)
            and not domain.follow_ups(event, result)
        )

    async def _publish(self, cause: Envelope[EventData], datas: list[EventData]) -> None:
        if not datas:
            return  # most events announce nothing
        await self.publisher.publish_caused_by(cause, datas, source=SOURCE, time=self.clock())
