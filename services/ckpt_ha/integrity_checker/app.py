"""Composition root of the integrity-checker process.

Verifies committed checkpoints (manifest, sizes, checksums, format checks) before anyone
restores them, tags the ones that fail into quarantine (moving their bytes aside), scrubs
valid checkpoints periodically against the checksums recorded when they were verified, and
verifies again any checkpoint whose verdict an outage lost (`reconcile`), and copies the valid
checkpoints of replicating tiers to their replica roots (`replication`): the integrity-checker
owns copies because it already reads every valid byte under a read budget and verifies it.

At N replicas the durable consumers split the commits between them; the scrub and the reconcile
loop each run on the one replica holding their lease (`ckpt_ha.runtime.leader`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from faststream import FastStream

from ckpt_ha.contracts import Envelope
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.integrity_checker.handlers import IntegrityHandlers
from ckpt_ha.integrity_checker.metrics import CopyMetrics, ScrubMetrics, VerifyMetrics
from ckpt_ha.integrity_checker.reconcile import Reconciler
from ckpt_ha.integrity_checker.replication import Replicator
from ckpt_ha.integrity_checker.scrub import Scrubber
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.leader import Leader
from ckpt_ha.runtime.service import Service, new_service
from ckpt_ha.storage import open_store
from ckpt_ha.storage.read_budget import ReadBudget
from ckpt_ha.telemetry.metrics import ReconcileMetrics

NAME = "integrity-checker"


@dataclass(kw_only=True)
class IntegrityChecker(Service):
    registry: Registry
    """Read only: the checker asks it what is already decided, the registrar writes it."""
    scrubber: Scrubber
    reconciler: Reconciler
    replicator: Replicator


def build(settings: IntegrityCheckerSettings, clock: Clock = utc_now) -> IntegrityChecker:
    base = new_service(NAME, settings)
    # One Redis client for the process: the registry (read) and the leases of its loops.
    client = connect(settings.redis())
    registry = Registry(client, settings.registry_prefix)
    leases = RedisLeases(client, settings.registry_prefix)
    store = open_store(settings.storage_root)
    scrub_metrics = ScrubMetrics(base.metrics)
    copy_metrics = CopyMetrics(base.metrics)
    handlers = IntegrityHandlers(
        store, base.bus, clock, settings.checksum, registry, VerifyMetrics(base.metrics)
    )
    replicator = Replicator(
        store,
        registry,
        base.bus,
        clock,
        settings.checksum,
        copy_metrics,
        settings.replica_roots,
        ReadBudget(
            settings.copy_bytes_per_s,
            settings.copy_burst_bytes,
            on_read=copy_metrics.read,
            on_wait=copy_metrics.waited,
        ),
    )
    svc = IntegrityChecker(
        name=NAME,
        bus=base.bus,
        metrics=base.metrics,
        checks={"redis": registry.ping},
        on_stop=registry.close,
        registry=registry,
        scrubber=Scrubber(
            store,
            registry,
            base.bus,
            clock,
            settings.checksum,
            scrub_metrics,
            # One budget for the scrub's reads on the one storage root this process serves.
            ReadBudget(
                settings.scrub_bytes_per_s,
                settings.scrub_burst_bytes,
                on_read=scrub_metrics.read,
                on_wait=scrub_metrics.waited,
            ),
            copies=replicator,
        ),
        reconciler=Reconciler(
            store,
            registry,
            handlers,
            clock,
            timedelta(seconds=settings.verify_deadline_s),
            ReconcileMetrics(base.metrics),
        ),
        replicator=replicator,
    )
    svc.bus.batch_consumer(
        "committed",
        event_filter(svc.bus.cfg.prefix, "checkpoint.committed"),
        payload=Envelope[CheckpointCommittedV1],
        description="Verifies each committed checkpoint and publishes verified or corrupt.",
    )(handlers.on_commits)
    svc.bus.consumer(
        "released",
        event_filter(svc.bus.cfg.prefix, "checkpoint.released"),
        description=(
            "Puts a checkpoint a human released from quarantine back in place and verifies it "
            "again: valid only if the checks pass."
        ),
    )(handlers.on_released)
    svc.bus.consumer(
        "copies-deleted",
        event_filter(svc.bus.cfg.prefix, "checkpoint.deleted"),
        description=(
            "Removes every copy of a deleted checkpoint from its replica (tiers that "
            "replicate) and records each copy deleted."
        ),
    )(svc.replicator.on_deleted)
    svc.finish(
        title="ckpt-ha integrity-checker",
        description=(
            "Verifies committed checkpoints (manifest, sizes, checksums, format checks) "
            "before anyone restores them."
        ),
    )
    if settings.scrub_interval_s > 0:
        svc.in_background(
            lambda: svc.scrubber.run(settings.scrub_interval_s),
            leader=Leader(leases, svc.metrics, "scrub", settings.loop_lease_s),
        )
    if settings.copy_interval_s > 0 and settings.replica_roots:
        svc.in_background(
            lambda: svc.replicator.run(settings.copy_interval_s),
            leader=Leader(leases, svc.metrics, "replicate", settings.loop_lease_s),
        )
    if settings.reconcile_interval_s > 0:
        svc.in_background(
            lambda: svc.reconciler.run(settings.reconcile_interval_s),
            leader=Leader(leases, svc.metrics, "reconcile", settings.loop_lease_s),
        )
    return svc


def asyncapi_app() -> FastStream:
    app = build(IntegrityCheckerSettings.model_construct()).app
    assert app is not None
    return app
