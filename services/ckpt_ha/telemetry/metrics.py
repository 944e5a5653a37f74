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

import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

FORGET_AFTER_S = 7 * 24 * 3600.0
"""A job with no update for this long leaves the per-job series."""

RESUME_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


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


class RestoreMetrics:
    """The restore-coordinator's decisions: plans by mode, escalations by reason, verdicts."""

    def __init__(self, metrics: ServiceMetrics, *, forget_after_s: float = FORGET_AFTER_S) -> None:
        self.service = metrics.service
        reg = metrics.registry
        self.decisions = Counter(
            "ckpt_ha_restore_decisions_total",
            "Failures decided: planned (by mode) or escalated (by reason).",
            ["service", "outcome", "detail"],
            registry=reg,
        )
        self.verdicts = Counter(
            "ckpt_ha_resume_verdicts_total",
            "Continuity verdicts after a resume (verified, diverged).",
            ["service", "verdict"],
            registry=reg,
        )
        self.stale_progress = Counter(
            "ckpt_ha_stale_progress_total",
            "Progress reports of an attempt older than one already planned for its run, sent "
            "at or after that attempt's failure (a fenced writer): ignored, never part of the "
            "trajectory or a continuity verdict.",
            ["service"],
            registry=reg,
        )
        self.reclaimed = Counter(
            "ckpt_ha_resume_leftovers_total",
            "Leftovers of failed attempts after a verified resume (cleaned, unreclaimable).",
            ["service", "outcome"],
            registry=reg,
        )
        self.outcomes = Counter(
            "ckpt_ha_resume_outcomes_total",
            "Resume steps by outcome: planned, loaded, load_failed, verified, diverged, escalated.",
            ["service", "outcome"],
            registry=reg,
        )
        self.durations = Histogram(
            "ckpt_ha_resume_duration_seconds",
            "Seconds from a job's failure to each resume stage (planned, loaded, verified, "
            "diverged).",
            ["service", "stage"],
            buckets=RESUME_BUCKETS,
            registry=reg,
        )
        self.escalations = Counter(
            "ckpt_ha_escalations_total",
            "Escalations to a human, by reason.",
            ["service", "reason"],
            registry=reg,
        )
        self.lost = Counter(
            "ckpt_ha_jobs_lost_total",
            "Attempts declared lost: neither progress nor heartbeat within their deadline.",
            ["service"],
            registry=reg,
        )
        self.restarts = JobGauges(
            "ckpt_ha_job_restarts",
            "Automatic restarts planned for a job (per job; a job leaves when it succeeds or "
            "stays idle).",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
            counter=True,
        )
        self.failures = JobGauges(
            "ckpt_ha_job_failures",
            "Failed attempts of a job (per job, like restarts).",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
            counter=True,
        )
        self.last_progress = JobGauges(
            "ckpt_ha_job_last_progress_timestamp_seconds",
            "When a job last reported progress (Unix time): tells running jobs from finished ones.",
            [],
            forget_after_s=forget_after_s,
            registry=reg,
        )
        self.last_outcome = JobGauges(
            "ckpt_ha_resume_last_outcome_timestamp_seconds",
            "When a job's resume last reached each outcome (Unix time); reason is the escalation "
            "reason, empty otherwise.",
            ["outcome", "reason"],
            forget_after_s=forget_after_s,
            registry=reg,
        )

    def job_started(self, job_id: str) -> None:
        """Make the job's per-job series exist at 0, so a first restart shows as an increase."""
        for gauge in (self.restarts, self.failures):
            if gauge.get(job_id) is None:
                gauge.set(job_id, value=0)

    def job_failed(self, job_id: str) -> None:
        self.failures.set(job_id, value=(self.failures.get(job_id) or 0) + 1)

    def outcome(
        self,
        job_id: str,
        outcome: str,
        *,
        at: float,
        reason: str = "",
        seconds: float | None = None,
    ) -> None:
        self.outcomes.labels(self.service, outcome).inc()
        self.last_outcome.set(job_id, outcome, reason, value=at)
        if outcome == "planned":
            self.restarts.set(job_id, value=(self.restarts.get(job_id) or 0) + 1)
        if outcome == "escalated":
            self.escalations.labels(self.service, reason).inc()
        if seconds is not None:
            self.durations.labels(self.service, outcome).observe(max(0.0, seconds))
