"""The common shape of a service process: a bus, metrics, health checks and a FastStream app."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from faststream import FastStream

from ckpt_ha.bus.broker import Bus
from ckpt_ha.runtime import heap
from ckpt_ha.runtime.leader import Leader
from ckpt_ha.runtime.server import (
    HealthCheck,
    faststream_metrics,
    make_app,
    publish_metrics,
    serve,
)
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import bounded
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import ServiceMetrics


@dataclass
class Service:
    name: str
    bus: Bus
    metrics: ServiceMetrics
    app: FastStream | None = None
    checks: Mapping[str, HealthCheck] = field(default_factory=dict)
    on_stop: Callable[[], Awaitable[None]] | None = None
    on_start: Callable[[], Awaitable[None]] | None = None
    """Awaited once when the app starts, before its broker consumes anything."""

    def finish(self, *, title: str, description: str) -> Service:
        """Create the app once every consumer is registered."""
        self.app = make_app(self.bus, title=title, description=description)
        return self

    def in_background(
        self,
        loop: Callable[[], Coroutine[Any, Any, None]],
        *,
        before: Callable[[], Awaitable[None]] | None = None,
        after: Callable[[], Awaitable[None]] | None = None,
        leader: Leader | None = None,
    ) -> None:
        """Run ``loop()`` as a task while the app runs (a polling loop, a scrub, retention
        rounds): started after the app starts (``before`` awaited first), cancelled and awaited
        on shutdown (``after`` awaited first). With a ``leader``, only the replica holding its
        lease runs the loop (`ckpt_ha.runtime.leader`)."""
        if self.app is None:
            raise RuntimeError(f"{self.name}: finish() before in_background()")
        tasks: list[asyncio.Task[None]] = []

        @self.app.after_startup
        async def _start() -> None:
            if before is not None:
                await before()
            tasks.append(asyncio.create_task(loop() if leader is None else leader.run(loop)))

        @self.app.on_shutdown
        async def _stop() -> None:
            if after is not None:
                await after()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def run(self, settings: ServiceSettings) -> None:
        if self.app is None:
            raise RuntimeError(f"{self.name}: finish() was not called")
        tracing.setup(self.name)  # exports only when OTEL_* configures it
        user_stop = self.on_stop
        heap.settle()  # everything is imported and built: the collector stops walking it

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
            on_start=self.on_start,
            consumer_info_interval_s=settings.consumer_info_interval_s,
            dependency_check_interval_s=settings.dependency_check_interval_s,
        )


def new_service(name: str, settings: ServiceSettings) -> Service:
    """A service's bus (reconnecting forever), metrics, and this process's bound on storage
    calls."""
    bounded.configure(timeout_s=settings.storage_timeout_s, workers=settings.storage_workers)
    bus = Bus(settings.bus(), name, lasting=True)
    metrics = ServiceMetrics(name)
    bus.broker.add_middleware(faststream_metrics(metrics))
    bus.on_published = publish_metrics(metrics)
    bus.dead_letters.on_outcome = metrics.message
    bus.dead_letters.on_dead_letter = metrics.dead_letter
    bus.dead_letters.on_park = metrics.park
    return Service(name=name, bus=bus, metrics=metrics)
