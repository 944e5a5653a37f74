"""A retention-janitor whose rounds a test runs itself, on its own view of resumes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.clock import Clock
from ckpt_ha.registry.client import connect
from ckpt_ha.retention_janitor import app
from ckpt_ha.retention_janitor.handlers import Janitor, ResumeHandlers
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.ports import RetentionRegistry
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.retention_janitor.store import RedisResumes
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage.port import ObjectStore
from ckpt_ha.telemetry.metrics import ServiceMetrics

KEEP_S = RetentionJanitorSettings.model_fields["state_ttl_s"].default


@contextlib.asynccontextmanager
async def rounds_janitor(
    settings: ServiceSettings, registry: RetentionRegistry, store: ObjectStore, clock: Clock
) -> AsyncIterator[Janitor]:
    """`Janitor` composed as the app does, with only the consumers that keep its view of
    resumes (``resume.planned``, ``.verified``, ``.diverged``, and ``job.started`` for the
    attempt's plan): no round runs unless the test runs it."""
    bus = Bus(settings.bus(), app.NAME)
    client = connect(settings.redis())
    view = RedisResumes(client, settings.registry_prefix, KEEP_S)
    handlers = ResumeHandlers(view)
    app.keep_view(bus, handlers)
    bus.consumer("started", event_filter(bus.cfg.prefix, "job.started"))(handlers.on_event)
    await bus.broker.start()
    metrics = RetentionMetrics(ServiceMetrics(app.NAME))
    try:
        yield Janitor(registry, view, app.feed(bus), store, bus, clock, metrics)
    finally:
        await bus.broker.stop()
        await client.aclose()
