"""Prometheus metrics shared by every service (one registry per process): the consumers',
handlers' and loops' own (`ServiceMetrics`), the reconcile rounds of the writer-watcher and the
integrity-checker (`ReconcileMetrics`), and the per-job series that forget idle jobs
(`JobGauges`). Each service's own metrics live in its ``metrics.py``.

Label sets stay bounded: never a checkpoint id. Per-job series (recovery point, restarts,
last resume outcome) are bounded by the number of active jobs: a job that stays idle for
``forget_after_s`` (default a week) is dropped from them, so they are
bounded by the jobs active within that time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("ckpt_ha.telemetry")

FORGET_AFTER_S = 7 * 24 * 3600.0
"""A job with no update for this long leaves the per-job series."""


class JobGauges(Collector):
    """Gauges keyed by job (plus bounded labels) that forget idle jobs.

    A plain `Gauge` per job would keep every job ever seen; this one drops a job's series when
    it is forgotten or not updated for ``forget_after_s``.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        *,
        forget_after_s: float = FORGET_AFTER_S,
        now: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        counter: bool = False,
    ) -> None:
        self.counter = counter
        """Exposed as a counter (name gets ``_total``): only ever increased, per job."""
        self.name = name
        self.documentation = documentation
        self.labels = ["job_id", *labels]
        self.forget_after_s = forget_after_s
        self.now = now
        self._values: dict[tuple[str, ...], tuple[float, float]] = {}
        if registry is not None:
            registry.register(self)

    def set(self, job_id: str, *labels: str, value: float, updated: float | None = None) -> None:
        """``updated``: when the job was last active (default now); idle time counts from it."""
        self._values[(job_id, *labels)] = (value, self.now() if updated is None else updated)

    def set_max(
        self, job_id: str, *labels: str, value: float, updated: float | None = None
    ) -> None:
        """Keep the larger of the stored and the given value (e.g. the newest timestamp)."""
        old = self._values.get((job_id, *labels))
        self.set(job_id, *labels, value=max(value, old[0]) if old else value, updated=updated)

    def replace(self, values: Mapping[tuple[str, ...], float]) -> None:
        """Exactly these series (keys: job id, then the labels), as read now from the state
        they mirror (a level read from Redis: every replica exports the same)."""
        now = self.now()
        self._values = {key: (value, now) for key, value in values.items()}

    def get(self, job_id: str, *labels: str) -> float | None:
        found = self._values.get((job_id, *labels))
        return found[0] if found else None

    def forget(self, job_id: str) -> None:
        for key in [k for k in self._values if k[0] == job_id]:
            del self._values[key]

    def _prune(self) -> None:
        cutoff = self.now() - self.forget_after_s
        for key in [k for k, (_, at) in self._values.items() if at < cutoff]:
            del self._values[key]

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        kind = CounterMetricFamily if self.counter else GaugeMetricFamily
        return kind(self.name, self.documentation, labels=self.labels)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        self._prune()
        family = self._family()
        for key, (value, _) in sorted(self._values.items()):
            family.add_metric(list(key), value)
        yield family


class CounterChildren:
    """A labelled counter's children, each looked up once: prometheus_client's ``labels``
    validates and takes a lock on every call, and a consumer counts every message. For label
    sets that are few and fixed (services, consumers, outcomes, states), never removed."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self._children: dict[tuple[str, ...], Counter] = {}

    def inc(self, *labels: str) -> None:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self.counter.labels(*labels)
        child.inc()


class ServiceMetrics:
    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.service = service
        # The process's own (memory, CPU, open files, GC): one process per replica, so the
        # dashboards show each one beside its service.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.messages = Counter(
            "ckpt_ha_messages_total",
            "Consumed messages by outcome (ack, nak, dead_letter).",
            ["service", "consumer", "outcome"],
            registry=self.registry,
        )
        self.transitions = Counter(
            "ckpt_ha_checkpoint_transitions_total",
            "Checkpoint lifecycle transitions applied by the registry.",
            ["service", "from_state", "to_state"],
            registry=self.registry,
        )
        self._messages = CounterChildren(self.messages)
        self._transitions = CounterChildren(self.transitions)
        self.up = Gauge(
            "ckpt_ha_service_up", "1 while the service runs.", ["service"], registry=self.registry
        )
        self.dependency_up = Gauge(
            "ckpt_ha_dependency_up",
            "1 while the service reaches this dependency (nats, redis), 0 while it does not; "
            "checked every few seconds and on each /healthz.",
            ["service", "dependency"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "ckpt_ha_dead_letters_total",
            "Events dead-lettered by this service, by consumer and error code.",
            ["service", "consumer", "code"],
            registry=self.registry,
        )
        self.parked = Counter(
            "ckpt_ha_parked_messages_total",
            "Deliveries of events of a version newer than this service knows, parked (nak'ed "
            "with the park delay) for a consumer that knows it: a rolling upgrade in progress, "
            "or a producer upgraded before its consumers.",
            ["service", "consumer", "event"],
            registry=self.registry,
        )
        self.consumer_pending = Gauge(
            "ckpt_ha_consumer_pending_messages",
            "Messages in the stream not yet delivered to this durable consumer (JetStream "
            "num_pending), polled periodically.",
            ["service", "consumer"],
            registry=self.registry,
        )
        self.consumer_ack_pending = Gauge(
            "ckpt_ha_consumer_ack_pending_messages",
            "Messages delivered to this consumer and not yet acknowledged (num_ack_pending).",
            ["service", "consumer"],
            registry=self.registry,
        )
        self.consumer_redelivered = Gauge(
            "ckpt_ha_consumer_redelivered_messages",
            "Messages delivered more than once and not yet acknowledged (num_redelivered).",
            ["service", "consumer"],
            registry=self.registry,
        )
        self.consumer_polled = Gauge(
            "ckpt_ha_consumer_info_timestamp_seconds",
            "When this consumer's info was last read from JetStream (Unix time).",
            ["service", "consumer"],
            registry=self.registry,
        )
        self.stream_messages = Gauge(
            "ckpt_ha_stream_messages",
            "Messages in a ckpt-ha JetStream stream (events, dead letters), polled with the "
            "consumer info.",
            ["service", "stream"],
            registry=self.registry,
        )
        self.stream_bytes = Gauge(
            "ckpt_ha_stream_bytes",
            "Bytes a ckpt-ha JetStream stream stores.",
            ["service", "stream"],
            registry=self.registry,
        )
        self.stream_max_bytes = Gauge(
            "ckpt_ha_stream_max_bytes",
            "The stream's max_bytes limit; -1 without one.",
            ["service", "stream"],
            registry=self.registry,
        )
        self.jetstream_storage = Gauge(
            "ckpt_ha_jetstream_storage_bytes",
            "JetStream file storage the service's NATS account uses (all its streams).",
            ["service"],
            registry=self.registry,
        )
        self.jetstream_storage_limit = Gauge(
            "ckpt_ha_jetstream_storage_limit_bytes",
            "The account's JetStream file storage limit; -1 or 0 without one.",
            ["service"],
            registry=self.registry,
        )
        self.loop_leader = Gauge(
            "ckpt_ha_loop_leader",
            "1 while this replica holds the lease of a periodic loop (scan, scrub, reconcile, "
            "retention rounds) and runs it, 0 while another replica does.",
            ["service", "loop", "replica"],
            registry=self.registry,
        )

    def message(self, consumer: str, outcome: str) -> None:
        self._messages.inc(self.service, consumer, outcome)

    def transition(self, previous: str, new: str) -> None:
        """A lifecycle transition the registry applied (``previous`` 'none': a new record)."""
        self._transitions.inc(self.service, previous, new)

    def dead_letter(self, consumer: str, code: str) -> None:
        self.dead_letters.labels(self.service, consumer, code).inc()

    def park(self, consumer: str, event: str) -> None:
        self.parked.labels(self.service, consumer, event).inc()


class ReconcileMetrics:
    """The re-drive of checkpoints left in a non-final state past their deadline (the
    integrity-checker for ``pending_verification``, the writer-watcher for ``writing``)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.service = metrics.service
        self.stuck = Gauge(
            "ckpt_ha_stuck_checkpoints",
            "Checkpoints in a non-final state past their deadline at the last reconcile round, "
            "by state (each is re-driven; one that stays here is still stuck: its dependency "
            "is down, or a human must look).",
            ["service", "state"],
            registry=metrics.registry,
        )
        self.redriven = Counter(
            "ckpt_ha_redriven_checkpoints_total",
            "Checkpoints re-driven by the reconciler, by the state they were stuck in.",
            ["service", "state"],
            registry=metrics.registry,
        )
        self.interrupted = Counter(
            "ckpt_ha_reconcile_interrupted_total",
            "Reconcile rounds cut short by a storage or registry outage (retried next round).",
            ["service"],
            registry=metrics.registry,
        )
        self.last_round = Gauge(
            "ckpt_ha_reconcile_last_round_timestamp_seconds",
            "When the last complete reconcile round finished (Unix time).",
            ["service"],
            registry=metrics.registry,
        )

    def round(self, state: str, stuck: int, redriven: int, at: float) -> None:
        """A complete round found ``stuck`` checkpoints in ``state`` and re-drove ``redriven``."""
        self.stuck.labels(self.service, state).set(stuck)
        if redriven:
            self.redriven.labels(self.service, state).inc(redriven)
        self.last_round.labels(self.service).set(at)


async def refresh_forever(refresh: Callable[[], Awaitable[None]], interval_s: float) -> None:
    """``refresh()`` now and every ``interval_s`` (on every replica: level metrics read from
    shared state); a failed read keeps the last values (its outage has its own alerts)."""
    while True:
        try:
            await refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the next round reads again
            log.warning("level metrics not refreshed: %r", exc)
        await asyncio.sleep(interval_s)
