"""The common shape of a service process: a bus, metrics, health checks and a FastStream app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from faststream import FastStream

from services.shared import tracing
from services.shared.bus import Bus
from services.shared.metrics import ServiceMetrics
from services.shared.runtime import HealthCheck, make_app, serve
from services.shared.settings import ServiceSettings


@dataclass
class Service:
    name: str
    bus: Bus
    metrics: ServiceMetrics
    app: FastStream | None = None
    checks: Mapping[str, HealthCheck] = field(default_factory=dict)
    on_stop: Callable[[], Awaitable[None]] | None = None

    def finish(self, *, title: str, description: str) -> Service:
        """Create the app once every consumer is registered."""
        self.app = make_app(self.bus, title=title, description=description)
        return self

    async def run(self, settings: ServiceSettings) -> None:
        if self.app is None:
            raise RuntimeError(f"{self.name}: finish() was not called")
        tracing.setup(self.name)  # exports only when OTEL_* configures it
        user_stop = self.on_stop

        async def stop() -> None:
            try:
                if user_stop is not None:
                    await user_stop()
            finally:
                tracing.shutdown()  # flush the last spans

        await serve(
            self.app,
            self.bus,
            self.metrics,
            host=settings.http_host,
            port=settings.http_port,
            extra_checks=self.checks,
            on_stop=stop,
        )


def new_service(name: str, settings: ServiceSettings) -> Service:
    return Service(name=name, bus=Bus(settings.bus(), name), metrics=ServiceMetrics(name))
