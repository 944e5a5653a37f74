"""Composition root of the registrar process."""

from __future__ import annotations

from dataclasses import dataclass

from faststream import FastStream

from contracts.subjects import aggregate_filter
from services.registrar.handlers import RegistrarHandlers
from services.registrar.settings import RegistrarSettings
from services.shared.bus import Bus
from services.shared.clock import Clock, utc_now
from services.shared.metrics import ServiceMetrics
from services.shared.registry import Registry
from services.shared.runtime import make_app, serve

NAME = "registrar"


@dataclass
class Registrar:
    app: FastStream
    bus: Bus
    registry: Registry
    metrics: ServiceMetrics


def build(settings: RegistrarSettings, clock: Clock = utc_now) -> Registrar:
    """Wire the registrar; nothing connects until the app starts."""
    bus = Bus(settings.bus(), NAME)
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    metrics = ServiceMetrics(NAME)
    handlers = RegistrarHandlers(registry, bus, metrics, clock)
    bus.consumer(
        "checkpoints",
        aggregate_filter(bus.cfg.prefix, "checkpoint"),
        description="Projects every checkpoint event into the registry (the lifecycle of R1).",
    )(handlers.on_checkpoint_event)
    app = make_app(
        bus,
        title="ckpt-ha registrar",
        description="Keeps the checkpoint registry: one state per checkpoint, legal moves only.",
    )
    return Registrar(app=app, bus=bus, registry=registry, metrics=metrics)


def asyncapi_app() -> FastStream:
    return build(RegistrarSettings.model_construct()).app


async def main(settings: RegistrarSettings) -> None:
    svc = build(settings)
    await serve(
        svc.app,
        svc.bus,
        svc.metrics,
        host=settings.http_host,
        port=settings.http_port,
        extra_checks={"redis": svc.registry.ping},
        on_stop=svc.registry.close,
    )
