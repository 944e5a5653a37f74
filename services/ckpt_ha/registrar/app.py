"""Composition root of the registrar process."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from faststream import FastStream
from redis.exceptions import RedisError

from ckpt_ha.contracts import Envelope
from ckpt_ha.contracts.checkpoint import CheckpointEvent, CheckpointState
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.contracts.subjects import aggregate_filter, event_filter
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.registrar.handlers import RegistrarHandlers
from ckpt_ha.registrar.metrics import LifecycleMetrics
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.service import Service, new_service
from ckpt_ha.storage import ObjectStore, keys_in, open_store
from ckpt_ha.telemetry.metrics import refresh_forever

NAME = "registrar"
log = logging.getLogger("ckpt_ha.registrar")


@dataclass(kw_only=True)
class Registrar(Service):
    registry: Registry
    store: ObjectStore
    """The storage root, never read: it names locations (a location must be its job's)."""


def build(settings: RegistrarSettings, clock: Clock = utc_now) -> Registrar:
    """Wire the registrar; nothing connects until the app starts."""
    base = new_service(NAME, settings)
    registry = Registry.from_url(
        settings.redis(), settings.registry_prefix, applied_window_s=settings.applied_window_s
    )
    store = open_store(settings.storage_root)
    svc = Registrar(
        name=NAME,
        bus=base.bus,
        metrics=base.metrics,
        checks={"redis": registry.ping},
        on_stop=registry.close,
        registry=registry,
        store=store,
    )
    lifecycle = LifecycleMetrics(svc.metrics, forget_after_s=settings.metrics_forget_after_s)

    async def seed_metrics() -> None:
        """Per-job metrics continue after a restart instead of waiting for the next event."""
        try:
            valid = await registry.by_state(CheckpointState.VALID)
        except RedisError as exc:
            log.warning("per-job metrics start empty: registry unavailable (%s)", exc)
            return
        lifecycle.seed(valid)

    async def read_levels() -> None:
        """The levels pages rest on, from the registry (the same on every replica)."""
        lifecycle.open_writes(await registry.by_state(CheckpointState.WRITING))
        corrupt = await registry.by_state(CheckpointState.CORRUPT)
        lifecycle.to_review([*corrupt, *await registry.by_state(CheckpointState.QUARANTINED)])

    svc.on_start = seed_metrics
    svc.bus.broker.on_stream = registry.remember_stream  # a rebuild then refuses another stream
    handlers = RegistrarHandlers(
        registry, svc.bus, svc.metrics, clock, lifecycle, key_of=keys_in(store)
    )
    svc.bus.batch_consumer(
        "checkpoints",
        aggregate_filter(svc.bus.cfg.prefix, "checkpoint"),
        payload=CheckpointEvent,
        description="Projects every checkpoint event into the registry (the lifecycle of R1).",
    )(handlers.on_checkpoint_events)
    svc.bus.batch_consumer(
        "fences",
        event_filter(svc.bus.cfg.prefix, "resume.planned"),
        payload=Envelope[ResumePlannedV2],
        description=(
            "Learns the fences (R17) from the coordinator's plans: once attempt N+1 of a run is"
            " planned, a commit of attempt N or older is held as fenced, never valid."
        ),
    )(handlers.on_checkpoint_events)
    svc.finish(
        title="ckpt-ha registrar",
        description="Keeps the checkpoint registry: one state per checkpoint, legal moves only.",
    )
    svc.in_background(lambda: refresh_forever(read_levels, settings.state_metrics_interval_s))
    return svc


def asyncapi_app() -> FastStream:
    app = build(RegistrarSettings.model_construct()).app
    assert app is not None
    return app
