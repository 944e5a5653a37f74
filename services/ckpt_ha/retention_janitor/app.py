"""Composition root of the retention-janitor process.

Expires and deletes checkpoints by tier, never one that something still references: periodic
rounds over the whole registry, a round for a job whenever it registers a new valid checkpoint,
and the tier each job declares when it starts.

At N replicas the per-job rounds follow the `registered` events the durable consumer splits
between them; the periodic rounds run on the one replica holding their lease
(`ckpt_ha.runtime.leader`). Two rounds that meet on one checkpoint publish its expiry and
tombstone under ids keyed on the checkpoint, so JetStream keeps one of each.

What protects a checkpoint from outside its record (restore plans, resumes in progress, R15
pins) is the janitor's own view, kept from the events by its consumers (``planned``,
``verified``, ``diverged``, ``released``; ``started`` too) in its own key space
(`ckpt_ha.retention_janitor.store`); it reads no state of the restore-coordinator's. Durables
new in a release read the stream from its start, so on the upgrade that adds them the view is
built from every plan and registration ever published, without a rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from faststream import FastStream

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor.adapters import ConsumerFeed
from ckpt_ha.retention_janitor.archive import open_archive
from ckpt_ha.retention_janitor.handlers import Janitor, JanitorHandlers, ResumeHandlers
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.retention_janitor.store import RedisResumes
from ckpt_ha.runtime.leader import Leader
from ckpt_ha.runtime.service import Service, new_service
from ckpt_ha.storage import open_store

NAME = "retention-janitor"
PLANNED = "planned"
"""The consumer of ``resume.planned``: a round waits until it has applied every one
(`ConsumerFeed`)."""
VIEW = (
    (PLANNED, "resume.planned", "A restore plan and the checkpoints it pins (R6, R15)"),
    ("verified", "resume.verified", "A resume verified: its plan references nothing more"),
    ("diverged", "resume.diverged", "A resume diverged: its plan references nothing more"),
)
"""The consumers of the janitor's view of resumes besides ``started`` and ``registered``."""


def keep_view(bus: Bus, handlers: ResumeHandlers) -> None:
    """The consumers that keep the janitor's view of resumes from the ``resume.*`` events."""
    for consumer, event_type, description in VIEW:
        bus.consumer(consumer, event_filter(bus.cfg.prefix, event_type), description=description)(
            handlers.on_event
        )


def feed(bus: Bus) -> ConsumerFeed:
    """Where the view stands: the ``planned`` durable of this service on the event stream."""
    return ConsumerFeed(
        lambda: bus.broker.connection.jetstream(timeout=bus.cfg.request_timeout_s),
        bus.cfg.events_stream,
        bus.durable_name(PLANNED),
    )


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
        RedisResumes(client, settings.registry_prefix, settings.state_ttl_s),
        feed(base.bus),
        open_store(settings.storage_root),
        base.bus,
        clock,
        RetentionMetrics(base.metrics),
        archive=open_archive(settings.tombstone_archive, create=True),
        hot=timedelta(days=settings.tombstone_hot_days),
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
        description=(
            "Records the tier a job declares at start (a recorded choice still wins), and "
            "which plan the attempt resumes."
        ),
    )(handlers.on_started)
    keep_view(svc.bus, handlers.resumes)
    svc.bus.consumer(
        "released",
        event_filter(svc.bus.cfg.prefix, "checkpoint.registered"),
        description="Releases the pins a new valid checkpoint makes unnecessary (R15).",
    )(handlers.on_released)
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
