"""Prometheus metrics shared by every service (one registry per process).

Label sets stay bounded: never a checkpoint id. Per-job series (recovery point, restarts,
last resume outcome) are bounded by the number of active jobs: a job that stays idle for
``forget_after_s`` (default a week) is dropped from them, so they are
bounded by the jobs active within that time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointWriteFailedV1,
)
from ckpt_ha.core.records import Applied, CheckpointRecord

FORGET_AFTER_S = 7 * 24 * 3600.0
"""A job with no update for this long leaves the per-job series."""

REASON_CLASSES = (
    ("corrupt", "corrupt"),
    ("incomplete", "incomplete"),
    ("unsafe", "unsafe"),
    ("unknown", "unknown"),
    ("scrub", "scrub"),
    ("re-verification failed", "scrub"),
    ("integrity check failed", "integrity_check_failed"),
    ("load failed", "load_failed"),
    ("files missing after commit", "files_missing"),
    ("write stalled", "stalled"),
    ("folder removed", "folder_removed"),
)
"""Free-text reasons map onto these classes by how they start; anything else is ``other``."""

VERIFY_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def reason_class(reason: str) -> str:
    """A bounded label for a free-text reason: its verdict or leading words, else ``other``."""
    text = reason.strip().lower()
    for prefix, label in REASON_CLASSES:
        if text.startswith(prefix):
            return label
    return "other"


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


class ScrubMetrics:
    """The integrity-checker's periodic re-verification of valid checkpoints."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.service = metrics.service
        self.scrubbed = Counter(
            "ckpt_ha_scrubbed_checkpoints_total",
            "Valid checkpoints re-verified on storage by a scrub.",
            ["service"],
            registry=metrics.registry,
        )
        self.corrupt = Counter(
            "ckpt_ha_scrub_corrupt_total",
            "Valid checkpoints a scrub found changed or missing, and quarantined.",
            ["service"],
            registry=metrics.registry,
        )
        self.interrupted = Counter(
            "ckpt_ha_scrub_interrupted_total",
            "Scrub rounds cut short by a storage or registry outage (retried next round).",
            ["service"],
            registry=metrics.registry,
        )
        self.last_round = Gauge(
            "ckpt_ha_scrub_last_round_timestamp_seconds",
            "When the last scrub round that finished a pass over every valid checkpoint ended "
            "(Unix time).",
            ["service"],
            registry=metrics.registry,
        )
        self.paused = Counter(
            "ckpt_ha_scrub_paused_total",
            "Scrub rounds that reached the scrub interval before reading every valid checkpoint "
            "at their read budget (the next round continues where it stopped).",
            ["service"],
            registry=metrics.registry,
        )
        self.read_bytes = Counter(
            "ckpt_ha_scrub_read_bytes_total",
            "Bytes the scrub read from storage.",
            ["service"],
            registry=metrics.registry,
        )
        self.throttled = Counter(
            "ckpt_ha_scrub_throttle_wait_seconds_total",
            "Seconds the scrub's reads waited for their read budget (scrub_bytes_per_s).",
            ["service"],
            registry=metrics.registry,
        )
        self.budget = Gauge(
            "ckpt_ha_scrub_budget_bytes_per_second",
            "The scrub's read budget on the storage root (0: unlimited).",
            ["service"],
            registry=metrics.registry,
        )

    def read(self, n: int) -> None:
        """``n`` bytes read by the scrub (called from storage worker threads)."""
        self.read_bytes.labels(self.service).inc(n)

    def waited(self, seconds: float) -> None:
        """A scrub read waited ``seconds`` for its budget (called from storage worker threads)."""
        self.throttled.labels(self.service).inc(seconds)


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


class VerifyMetrics:
    """The integrity-checker's verification work: how long it took and how many bytes it read."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.service = metrics.service
        self.seconds = Histogram(
            "ckpt_ha_verification_seconds",
            "Time spent verifying one checkpoint on storage, by format and verdict.",
            ["service", "format", "verdict"],
            buckets=VERIFY_BUCKETS,
            registry=metrics.registry,
        )
        self.bytes = Counter(
            "ckpt_ha_verified_bytes_total",
            "Bytes read while verifying checkpoints, by format and verdict.",
            ["service", "format", "verdict"],
            registry=metrics.registry,
        )

    def observe(self, fmt: str, verdict: str, seconds: float, nbytes: int) -> None:
        self.seconds.labels(self.service, fmt, verdict).observe(seconds)
        self.bytes.labels(self.service, fmt, verdict).inc(nbytes)


class LifecycleMetrics:
    """What the registrar sees of every checkpoint: states by format, corruption, write failures,
    the recovery point per job, and the newest corrupt checkpoint per job (for pages)."""

    def __init__(self, metrics: ServiceMetrics, *, forget_after_s: float = FORGET_AFTER_S) -> None:
        self.service = metrics.service
        reg = metrics.registry
        self.states = Counter(
            "ckpt_ha_checkpoint_states_total",
            "Checkpoints entering each lifecycle state, by format.",
            ["service", "state", "format"],
            registry=reg,
        )
        self._states = CounterChildren(self.states)
        self.corrupt = Counter(
            "ckpt_ha_checkpoint_corrupt_total",
            "Checkpoints found corrupt (or quarantined automatically after a failed load or "
            "scrub), by reason class and side.",
            ["service", "reason", "side"],
            registry=reg,
        )
        self.quarantined = Counter(
            "ckpt_ha_checkpoint_quarantined_total",
            "Checkpoints quarantined, by who decided (automatic or manual).",
            ["service", "by"],
            registry=reg,
        )
        self.write_failures = Counter(
            "ckpt_ha_checkpoint_write_failures_total",
            "Checkpoint writes that failed or stalled, by classification (side).",
            ["service", "side", "reason"],
            registry=reg,
        )
        self.last_valid = JobGauges(
            "ckpt_ha_last_valid_checkpoint_timestamp_seconds",
            "When the newest valid checkpoint of a job was committed (Unix time); the recovery "
            "point is time() minus this.",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
        )
        self.recovery_point = _Age(
            "ckpt_ha_recovery_point_age_seconds",
            "Seconds since the newest valid checkpoint of a job was committed.",
            self.last_valid,
            registry=reg,
        )
        self.last_corrupt_at = JobGauges(
            "ckpt_ha_last_corrupt_checkpoint_timestamp_seconds",
            "When the newest corrupt checkpoint of a job was found (Unix time).",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
        )
        self.last_corrupt_step = JobGauges(
            "ckpt_ha_last_corrupt_checkpoint_step",
            "Training step of the newest corrupt checkpoint of a job (-1 when unknown).",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
        )
        self.oldest_write = JobGauges(
            "ckpt_ha_checkpoint_write_oldest_started_timestamp_seconds",
            "When the oldest checkpoint write of a job still open (state writing) started.",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
        )
        self.last_write_failure = JobGauges(
            "ckpt_ha_last_write_failure_timestamp_seconds",
            "When a checkpoint write of a job last failed or stalled (Unix time), by side and "
            "reason class.",
            ["side", "reason"],
            forget_after_s=forget_after_s,
            registry=reg,
        )
        self._open_writes: dict[str, dict[str, float]] = {}

    def seed(self, valid: Iterable[CheckpointRecord], writing: Iterable[CheckpointRecord]) -> None:
        """Continue after a restart from what the registry holds: each job's newest valid
        checkpoint and its open writes (jobs idle longer than ``forget_after_s`` stay out)."""
        for record in valid:
            self.last_valid.set_max(
                record.job_id,
                value=record.created_at.timestamp(),
                updated=record.updated_at.timestamp(),
            )
        for record in writing:
            self.write_opened(record.job_id, record.checkpoint_id, record.created_at.timestamp())

    def observe(self, event: Envelope[EventData], result: Applied) -> None:
        """One event the registry applied (call it only when it changed the state)."""
        step, record = result.transition, result.record
        if step is None or record is None:
            return
        service = self.service
        self._states.inc(service, step.new, record.format)
        job, at = record.job_id, event.time.timestamp()
        if step.new == CheckpointState.WRITING:
            self.write_opened(job, record.checkpoint_id, at)
        else:
            self.write_closed(job, record.checkpoint_id)
        if step.new == CheckpointState.VALID:
            self.last_valid.set_max(job, value=record.created_at.timestamp())
        data = event.data
        corrupt = False
        if isinstance(data, CheckpointWriteFailedV1):
            why = reason_class(data.reason)
            self.write_failures.labels(service, data.side, why).inc()
            self.last_write_failure.set(job, data.side, why, value=at)
        elif isinstance(data, CheckpointCorruptV1):
            corrupt = True
            self.corrupt.labels(service, reason_class(data.reason), data.side).inc()
        elif isinstance(data, CheckpointQuarantinedV1):
            self.quarantined.labels(service, "manual" if data.actor else "automatic").inc()
            if step.previous == CheckpointState.VALID and not data.actor:
                # A failed load or a scrub found a valid checkpoint damaged: corrupt as well.
                corrupt = True
                self.corrupt.labels(service, reason_class(data.reason), "unknown").inc()
        if corrupt:
            self.last_corrupt_at.set(job, value=at)
            self.last_corrupt_step.set(job, value=-1 if record.step is None else record.step)

    def write_opened(self, job_id: str, checkpoint_id: str, at: float) -> None:
        self._open_writes.setdefault(job_id, {}).setdefault(checkpoint_id, at)
        self.oldest_write.set(job_id, value=min(self._open_writes[job_id].values()))

    def write_closed(self, job_id: str, checkpoint_id: str) -> None:
        opened = self._open_writes.get(job_id)
        if opened is None or opened.pop(checkpoint_id, None) is None:
            return
        if opened:
            self.oldest_write.set(job_id, value=min(opened.values()))
        else:
            del self._open_writes[job_id]
            self.oldest_write.forget(job_id)


class _Age(Collector):
    """``now - timestamp`` for every series of a `JobGauges` of timestamps."""

    def __init__(
        self,
        name: str,
        documentation: str,
        source: JobGauges,
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.source = source
        registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.source.labels)]

    def collect(self) -> Iterable[Metric]:
        now = self.source.now()
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.source.labels)
        for series in self.source.collect():
            for sample in series.samples:
                family.add_metric(list(sample.labels.values()), max(0.0, now - sample.value))
        yield family


class RetentionMetrics:
    """The retention-janitor's rounds: decisions by tier and action, deletions, failures."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.service = metrics.service
        self.registry = metrics.registry
        self.decisions = Counter(
            "ckpt_ha_retention_actions_total",
            "Retention actions carried out (expire, delete) by the job's protection tier.",
            ["service", "tier", "action"],
            registry=metrics.registry,
        )
        self.protected = Gauge(
            "ckpt_ha_retention_protected_checkpoints",
            "Checkpoints a reference protects (pin, plan, resume, fallback, last valid), by tier "
            "and the kind of their first protection.",
            ["service", "tier", "kind"],
            registry=metrics.registry,
        )
        self.checkpoints = Gauge(
            "ckpt_ha_retention_checkpoints",
            "Checkpoints not yet deleted, by their job's protection tier and lifecycle state "
            "(set by each full retention round).",
            ["service", "tier", "state"],
            registry=metrics.registry,
        )
        self.delete_failures = Counter(
            "ckpt_ha_retention_delete_failures_total",
            "Deletions that failed on storage (kept expired; retried next round).",
            ["service"],
            registry=metrics.registry,
        )
        self.last_round = Gauge(
            "ckpt_ha_retention_last_round_timestamp_seconds",
            "When the last complete retention round finished (Unix time).",
            ["service"],
            registry=metrics.registry,
        )
