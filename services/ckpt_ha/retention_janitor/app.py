"""Composition root of the retention-janitor process.

Expires and deletes checkpoints by tier, never one that something still references: periodic
rounds over the whole registry, a round for a job whenever it registers a new valid checkpoint,
and the tier each job declares when it starts.

At N replicas the per-job rounds follow the `registered` events the durable consumer splits
between them; the periodic rounds run on the one replica holding their lease
(`ckpt_ha.runtime.leader`). Two rounds that meet on one checkpoint publish its expiry and
tombstone under ids keyed on the checkpoint, so JetStream keeps one of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from faststream import FastStream

from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.registry.pins import RedisPins
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator.api import RestoreReader
from ckpt_ha.retention_janitor.handlers import Janitor, JanitorHandlers
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.runtime.leader import Leader
from ckpt_ha.runtime.service import Service, new_service
from ckpt_ha.storage import open_store

NAME = "retention-janitor"


@dataclass(kw_only=True)
class RetentionJanitor(Service):
    registry: Registry
    janitor: Janitor


def build(settings: RetentionJanitorSettings, clock: Clock = utc_now) -> RetentionJanitor:
    base = new_service(NAME, settings)
    # One Redis client for the process; each key space is read through its owner.
    client = connect(settings.redis())
    registry = Registry(client, settings.registry_prefix)
    janitor = Janitor(
        registry,
        RedisPins(client, settings.registry_prefix),
        RestoreReader(client, settings.registry_prefix),
        open_store(settings.storage_root),
        base.bus,
        clock,
        RetentionMetrics(base.metrics),
    )
    svc = RetentionJanitor(
        name=NAME,
        bus=base.bus,
        metrics=base.metrics,
        checks={"redis": registry.ping},
        on_stop=registry.close,
        registry=registry,
        janitor=janitor,
    )
    handlers = JanitorHandlers(janitor)
    svc.bus.consumer(
        "registered",
        event_filter(svc.bus.cfg.prefix, "checkpoint.registered"),
        description="A retention round for the job whose new valid checkpoint was registered.",
    )(handlers.on_registered)
    svc.bus.consumer(
        "started",
        event_filter(svc.bus.cfg.prefix, "job.started"),
        description="Records the tier a job declares at start (a recorded choice still wins).",
    )(handlers.on_started)
    svc.finish(
        title="ckpt-ha retention-janitor",
        description=(
            "Expires and deletes checkpoints by tier, never one that something still references."
        ),
    )
    if settings.retention_interval_s > 0:
        svc.in_background(
            lambda: janitor.run(settings.retention_interval_s),
            leader=Leader(
                RedisLeases(client, settings.registry_prefix),
                svc.metrics,
                "retention",
                settings.loop_lease_s,
            ),
        )
    return svc


def asyncapi_app() -> FastStream:
    app = build(RetentionJanitorSettings.model_construct()).app
    assert app is not None
    return app
