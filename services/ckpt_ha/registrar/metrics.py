"""The registrar's metrics: what it sees of every checkpoint's lifecycle (registered in the
process's registry of `ckpt_ha.telemetry.metrics.ServiceMetrics`)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointWriteFailedV1,
)
from ckpt_ha.core.corruption import awaiting_review
from ckpt_ha.core.records import Applied, CheckpointRecord
from ckpt_ha.telemetry.metrics import FORGET_AFTER_S, CounterChildren, JobGauges, ServiceMetrics

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


VALID_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 14400)
"""Seconds from commit to valid: the committed→valid objective's bound (1800 s by default in
the SLO rules of alerts.yml) must be one of them."""


def reason_class(reason: str) -> str:
    """A bounded label for a free-text reason: its verdict or leading words, else ``other``."""
    text = reason.strip().lower()
    for prefix, label in REASON_CLASSES:
        if text.startswith(prefix):
            return label
    return "other"


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
        self.commit_to_valid = Histogram(
            "ckpt_ha_commit_to_valid_seconds",
            "Seconds from a checkpoint's commit (pending_verification) to valid: what the "
            "committed-to-valid objective measures (queueing and verification together).",
            ["service"],
            buckets=VALID_BUCKETS,
            registry=reg,
        )
        self.oldest_write = JobGauges(
            "ckpt_ha_checkpoint_write_oldest_started_timestamp_seconds",
            "When the oldest checkpoint write of a job still open (state writing) started: "
            "read from the registry's writing records, so every replica exports the same.",
            [],
            forget_after_s=float("inf"),
            registry=reg,
        )
        self.awaiting_review = JobGauges(
            "ckpt_ha_checkpoints_awaiting_review",
            "Checkpoints of a job found corrupt that no person has acted on yet (corrupt, or "
            "quarantined automatically): read from the registry, so every replica exports the "
            "same; one leaves when someone releases it or retention expires it.",
            [],
            forget_after_s=float("inf"),
            registry=reg,
        )
        self.review_step = JobGauges(
            "ckpt_ha_checkpoint_awaiting_review_newest_step",
            "Training step of the newest checkpoint of a job awaiting review (-1 when unknown), "
            "read from the registry with ckpt_ha_checkpoints_awaiting_review: what the page "
            "names.",
            [],
            forget_after_s=float("inf"),
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

    def seed(self, valid: Iterable[CheckpointRecord]) -> None:
        """Continue after a restart from what the registry holds: each job's newest valid
        checkpoint (jobs idle longer than ``forget_after_s`` stay out)."""
        for record in valid:
            self.last_valid.set_max(
                record.job_id,
                value=record.created_at.timestamp(),
                updated=record.updated_at.timestamp(),
            )

    def open_writes(self, writing: Iterable[CheckpointRecord]) -> None:
        """The registry's writing records, as read now: each job's oldest start. From the
        registry, not from the events this replica applied: with replicas, the one that
        applied a write's ``writing`` is rarely the one that applies its commit."""
        oldest: dict[tuple[str, ...], float] = {}
        for record in writing:
            at = record.created_at.timestamp()
            oldest[(record.job_id,)] = min(at, oldest.get((record.job_id,), at))
        self.oldest_write.replace(oldest)

    def to_review(self, found: Iterable[CheckpointRecord]) -> None:
        """The registry's corrupt and quarantined records, as read now: per job, how many
        await a person (`ckpt_ha.core.corruption.awaiting_review`)."""
        counts: dict[tuple[str, ...], float] = {}
        newest: dict[tuple[str, ...], float] = {}
        for record in found:
            if awaiting_review(record):
                job = (record.job_id,)
                counts[job] = counts.get(job, 0.0) + 1
                step = -1.0 if record.step is None else float(record.step)
                newest[job] = max(step, newest.get(job, -1.0))
        self.awaiting_review.replace(counts)
        self.review_step.replace(newest)

    def observe(self, event: Envelope[EventData], result: Applied) -> None:
        """One event the registry applied (call it only when it changed the state)."""
        step, record = result.transition, result.record
        if step is None or record is None:
            return
        service = self.service
        self._states.inc(service, step.new, record.format)
        job, at = record.job_id, event.time.timestamp()
        if step.new == CheckpointState.VALID:
            self.last_valid.set_max(job, value=record.created_at.timestamp())
            committed = next(
                (h.at for h in record.history if h.state == CheckpointState.PENDING_VERIFICATION),
                None,
            )
            if committed is not None:
                seconds = (event.time - committed).total_seconds()
                self.commit_to_valid.labels(service).observe(max(0.0, seconds))
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
