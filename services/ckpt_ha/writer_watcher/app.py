"""Composition root of the writer-watcher process.

Turns checkpoint writes on storage into checkpoint.writing / committed / write_failed events,
by listing the storage root every few seconds. What it announced is kept in Redis (beside the
registry), so a restarted watcher announces nothing twice; it reads the registry (never writes
it) to tell a failed write from a valid checkpoint that lost files, and to re-drive writes the
registry still holds as writing past their deadline (`domain.overdue_writes`).

At N replicas one replica scans a storage root at a time (and re-drives its writes): the holder of
the root's scan lease (`ckpt_ha.runtime.leader`); the others stand by and take over within the
lease's lifetime when it dies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from faststream import FastStream

from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.leader import Leader
from ckpt_ha.runtime.service import Service, new_service
from ckpt_ha.storage import open_store
from ckpt_ha.telemetry.metrics import ReconcileMetrics
from ckpt_ha.writer_watcher import adapters, notify
from ckpt_ha.writer_watcher.handlers import Redrive, Watcher
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings

NAME = "writer-watcher"


@dataclass(kw_only=True)
class WriterWatcher(Service):
    watcher: Watcher
    registry: Registry
    """Read only; shares its Redis client with the watch state (one pool per process)."""
    state: adapters.RedisWatchState


def build(settings: WriterWatcherSettings, clock: Clock = utc_now) -> WriterWatcher:
    base = new_service(NAME, settings)
    store = open_store(settings.storage_root)
    client = connect(settings.redis())
    registry = Registry(client, settings.registry_prefix)
    state = adapters.RedisWatchState(client, settings.registry_prefix, store.uri("x"))
    svc = WriterWatcher(
        name=NAME,
        bus=base.bus,
        metrics=base.metrics,
        checks={"redis": registry.ping},
        on_stop=registry.close,
        registry=registry,
        state=state,
        watcher=Watcher(
            store,
            base.bus,
            clock,
            timedelta(seconds=settings.stall_timeout_s),
            state,
            registry,
            redrive=Redrive(
                timedelta(seconds=settings.writing_deadline_s),
                timedelta(seconds=settings.reconcile_interval_s),
                ReconcileMetrics(base.metrics),
            )
            if settings.reconcile_interval_s > 0
            else None,
            full_every=timedelta(seconds=settings.full_rescan_interval_s),
            removal_grace=timedelta(seconds=settings.removal_grace_s),
        ),
    )
    svc.finish(
        title="ckpt-ha writer-watcher",
        description=(
            "Turns checkpoint writes on storage into checkpoint.writing / committed / "
            "write_failed events."
        ),
    )
    wakeup = notify.for_store(store, settings.watch_mode)
    svc.in_background(
        lambda: svc.watcher.run(settings.poll_interval_s, wakeup),
        before=wakeup.start,
        after=wakeup.stop,
        leader=Leader(
            RedisLeases(client, settings.registry_prefix),
            svc.metrics,
            f"scan:{adapters.root_digest(store.uri('x'))}",
            settings.loop_lease_s,
        ),
    )
    return svc


def asyncapi_app() -> FastStream:
    app = build(WriterWatcherSettings.model_construct()).app
    assert app is not None
    return app
