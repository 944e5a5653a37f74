"""Composition root of the restore-coordinator process.

Plans a restore after each job failure (newest valid checkpoint, compatibility R14, recompute
range), stops automatic retries on the R9 conditions, falls back after a load failure, checks the
resumed job's continuity (R10), cleans up after a verified resume (R11) and keeps the fallback
checkpoints pinned until the resumed job has a newer valid one (R15).

Operators steer it through events (``ckpt-ha job ...``): ``job.held`` / ``job.unheld`` pause and
resume automatic restores of a job (a held job's failures are recorded, not planned; on unhold
the latest failure is planned if nothing decided it meanwhile), and ``job.restore_requested``
plans the job's latest attempt, failed or running, from the valid checkpoint the operator chose.

nats-server 2.9 allows one filter subject per consumer: one durable consumer per event type.
Each consumer handles its events one at a time in stream order, except those in `BATCHED`
(a fetched batch at a time; failures of different jobs concurrently, each job's in order).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from faststream import FastStream

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope
from ckpt_ha.contracts.job import JobFailedV1, JobHeartbeatV1, JobProgressV1
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.registry.pins import RedisPins
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator.handlers import CoordinatorHandlers
from ckpt_ha.restore_coordinator.handlers.closing import Closings
from ckpt_ha.restore_coordinator.handlers.decide import (
    Decider,
    DecisionRules,
    Sources,
    new_owner_id,
)
from ckpt_ha.restore_coordinator.handlers.failures import Failures, Quarantine
from ckpt_ha.restore_coordinator.handlers.job_index import JobIndexing
from ckpt_ha.restore_coordinator.handlers.operator import OperatorActs
from ckpt_ha.restore_coordinator.handlers.outbox import Outbox
from ckpt_ha.restore_coordinator.handlers.reports import Reports
from ckpt_ha.restore_coordinator.handlers.reshape import Replans
from ckpt_ha.restore_coordinator.metrics import RESTART_WINDOW_S, RestoreMetrics
from ckpt_ha.restore_coordinator.ports import (
    CheckpointReads,
    NewId,
    ObjectStore,
    PinStore,
    Publisher,
    RestoreState,
    StoredEvents,
)
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.restore_coordinator.store import RedisRestores
from ckpt_ha.restore_coordinator.store.job_index import RedisJobIndex
from ckpt_ha.restore_coordinator.watchdog import LostAttempts
from ckpt_ha.runtime.leader import Leader
from ckpt_ha.runtime.service import Service, new_service
from ckpt_ha.storage import open_store
from ckpt_ha.telemetry.metrics import refresh_forever

NAME = "restore-coordinator"
log = logging.getLogger("ckpt_ha.restore_coordinator")

CONSUMERS: tuple[tuple[str, str, str, str], ...] = (
    ("started", "job.started", "on_started", "Records each attempt's policy and restore target."),
    ("heartbeat", "job.heartbeat", "on_heartbeat",
     "Notes each attempt's sign of life: its heartbeat deadline starts again."),
    ("progress", "job.progress", "on_progress",
     "Keeps the progress trajectory; checks a resumed attempt's continuity (R10)."),
    ("failed", "job.failed", "on_failed",
     "Plans a restore from the newest valid checkpoint, or escalates (R9, R14)."),
    ("load-failed", "resume.load_failed", "on_load_failed",
     "Quarantines a checkpoint that failed to load and plans the previous one, or escalates."),
    ("registered", "checkpoint.registered", "on_registered",
     "Unpins fallback checkpoints once the resumed job registered a newer valid one (R15)."),
    ("verified", "resume.verified", "on_verified",
     "Cleans the failed attempt's leftovers after a verified resume (R11)."),
    ("loaded", "resume.loaded", "on_loaded",
     "Measures the time from a failure to the resumed job's loaded checkpoint (metrics)."),
    ("succeeded", "job.succeeded", "on_succeeded",
     "Ends the run: its start records may expire like the rest of its state."),
    ("held", "job.held", "on_held",
     "Pauses automatic restores of a job: its failures are recorded, not planned."),
    ("unheld", "job.unheld", "on_unheld",
     "Resumes automatic restores; plans the latest failure if it is still undecided."),
    ("restore-requested", "job.restore_requested", "on_restore_requested",
     "Plans the latest failure from the valid checkpoint an operator chose (a rollback)."),
)  # fmt: skip
"""(consumer, event type, handler method, description)."""
BATCHED: dict[str, tuple[str, Any]] = {
    "heartbeat": ("on_heartbeats", Envelope[JobHeartbeatV1]),
    "progress": ("on_progress_batch", Envelope[JobProgressV1]),
    "failed": ("on_failed_batch", Envelope[JobFailedV1]),
}
"""Handled a fetched batch at a time (batch handler, payload for the AsyncAPI document): what
every running job reports often, its Redis round trips per batch; and failures, which come in
bursts when a rack is lost, their jobs decided concurrently (`Failures.on_failed_batch`)."""
PROMPT = frozenset({"failed"})
"""Batched consumers whose events a job waits on: a lone failure is planned at once, not after
the projections' batch linger (`BusConfig.prompt_linger_s`)."""
JOB_CONSUMERS = ("started", "heartbeat", "progress", "failed", "succeeded")
"""Their backlog holds the lost-attempt loop back (`watchdog`)."""


INDEX_CONSUMERS = (
    ("job-index", "{p}.ev.>",
     "The job index: each job's and restore's event (a checkpoint's is skipped), for "
     "`ckpt-ha job list|show`."),
    ("job-index-heartbeat", "{p}.ev.job.heartbeat.*.*", "The job index: a job's newest report."),
    ("job-index-progress", "{p}.ev.job.progress.*.*", "The job index: a job's newest report."),
)  # fmt: skip
"""The job index's consumers (`ckpt_ha.restore_coordinator.store.job_index`): the event
stream's whole, and the progress stream's two subjects."""


@dataclass(kw_only=True)
class RestoreCoordinator(Service):
    state: RedisRestores
    pins: RedisPins
    handlers: CoordinatorHandlers
    lost: LostAttempts


def build(settings: RestoreCoordinatorSettings, clock: Clock = utc_now) -> RestoreCoordinator:
    base = new_service(NAME, settings)
    # One Redis client for the process; each key space is reached through its owner.
    client = connect(settings.redis())
    pins = RedisPins(client, settings.registry_prefix)
    state = RedisRestores(
        client,
        settings.registry_prefix,
        pins=pins,
        trajectory_limit=settings.trajectory_limit,
        ttl_s=settings.state_ttl_s,
    )
    metrics = RestoreMetrics(base.metrics, forget_after_s=settings.metrics_forget_after_s)
    handlers = compose_handlers(
        state,
        pins,
        Registry(client, settings.registry_prefix),
        open_store(settings.storage_root),
        base.bus,
        clock,
        metrics,
        lease_ttl_s=settings.lease_ttl_s,
        load_failed_grace_s=load_failed_grace(settings),
        verification_grace_s=grace(settings),
        stored=base.bus,
    )
    svc = RestoreCoordinator(
        name=NAME,
        bus=base.bus,
        metrics=base.metrics,
        checks={"redis": state.ping},
        on_stop=state.close,
        state=state,
        pins=pins,
        handlers=handlers,
        lost=LostAttempts(
            state, handlers.projection, base.bus, clock, metrics, lambda: backlog(base.bus)
        ),
    )
    for consumer, event_type, method, description in CONSUMERS:
        subject = event_filter(svc.bus.cfg.prefix, event_type)
        if batched := BATCHED.get(consumer):
            svc.bus.batch_consumer(
                consumer,
                subject,
                payload=batched[1],
                description=description,
                prompt=consumer in PROMPT,
            )(getattr(handlers, batched[0]))
        else:
            svc.bus.consumer(consumer, subject, description=description)(getattr(handlers, method))
    indexing = JobIndexing(RedisJobIndex(client, settings.registry_prefix))
    for consumer, subject, description in INDEX_CONSUMERS:
        svc.bus.batch_consumer(
            consumer, subject.format(p=svc.bus.cfg.prefix), description=description
        )(indexing.on_batch)
    svc.finish(
        title="ckpt-ha restore-coordinator",
        description="Plans, watches and verifies resumes after job failures.",
    )

    async def read_attention() -> None:
        metrics.attentions(await state.attention())
        since = clock() - timedelta(seconds=RESTART_WINDOW_S)
        metrics.restarts_in_window(await state.recent_restarts(since))

    svc.in_background(lambda: refresh_forever(read_attention, settings.state_metrics_interval_s))
    if settings.lost_check_interval_s > 0:
        svc.in_background(
            lambda: svc.lost.run(settings.lost_check_interval_s),
            leader=Leader(
                RedisLeases(client, settings.registry_prefix),
                svc.metrics,
                "lost",
                settings.loop_lease_s,
            ),
        )
    return svc


def compose_handlers(
    state: RestoreState,
    pins: PinStore,
    registry: CheckpointReads,
    store: ObjectStore,
    bus: Publisher,
    clock: Clock,
    metrics: RestoreMetrics,
    *,
    new_id: NewId = new_owner_id,
    lease_ttl_s: float = 30.0,
    load_failed_grace_s: float = 3.0,
    verification_grace_s: float = 40.0,
    stored: StoredEvents | None = None,
) -> CoordinatorHandlers:
    """Each handler with the collaborators of its unit of work, over one projection (the one
    writer of the coordinator's state). ``stored``: the stream's newest commit of a failed job
    (None: not read)."""
    projection = RestoreProjection(state, pins, registry)
    outbox = Outbox(bus, clock, state)
    decider = Decider(
        state,
        projection,
        Sources(registry, stored, store),
        outbox,
        metrics,
        DecisionRules(lease_ttl_s, verification_grace_s, new_id),
    )
    return CoordinatorHandlers(
        reports=Reports(state, projection, outbox, metrics),
        failures=Failures(
            state,
            projection,
            decider,
            Quarantine(store, registry, outbox),
            metrics,
            load_failed_grace_s=load_failed_grace_s,
        ),
        operator=OperatorActs(state, projection, registry, decider),
        closings=Closings(state, projection, registry, store, outbox, metrics),
        replans=Replans(state, projection, registry, outbox),
    )


async def backlog(bus: Bus) -> bool:
    """Whether a job-event consumer of this coordinator has messages not yet delivered.
    Delivered but unacknowledged ones do not count: a batch in hand is handled within moments,
    and a message parked for long (a newer version this coordinator cannot read yet) must not
    stop lost detection for every job."""
    job = {bus.durable_name(c) for c in JOB_CONSUMERS}
    infos = await bus.consumer_info()
    return any(durable in job and pending > 0 for durable, pending, _, _ in infos)


def grace(settings: RestoreCoordinatorSettings) -> float:
    """The verification grace (`CKPT_HA_VERIFICATION_GRACE_S`), cut to the bus's retry budget:
    a failure waiting longer than that would be dead-lettered, never planned. Cut, it is past
    its grace on its last delivery and decided with what is valid then."""
    return _within_budget(settings, "verification grace", settings.verification_grace_s)


def load_failed_grace(settings: RestoreCoordinatorSettings) -> float:
    """The load-failure grace (`CKPT_HA_LOAD_FAILED_GRACE_S`), cut like `grace`: a resumed
    attempt's failure waits for its ``resume.load_failed`` nak'ed, so within the retry budget."""
    return _within_budget(settings, "load-failure grace", settings.load_failed_grace_s)


def _within_budget(settings: RestoreCoordinatorSettings, what: str, grace_s: float) -> float:
    budget = settings.bus().retry_budget_s
    if grace_s <= budget:
        return grace_s
    log.warning(
        "%s %.1f s is longer than the retry budget (%.1f s of back-off): "
        "a failure waits %.1f s at most",
        what,
        grace_s,
        budget,
        budget,
    )
    return budget


def asyncapi_app() -> FastStream:
    app = build(RestoreCoordinatorSettings.model_construct()).app
    assert app is not None
    return app
