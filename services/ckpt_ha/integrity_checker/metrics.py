"""The integrity-checker's metrics: its verification work and its scrub of valid checkpoints
(registered in the process's registry of `ckpt_ha.telemetry.metrics.ServiceMetrics`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from ckpt_ha.telemetry.metrics import ServiceMetrics

VERIFY_BUCKETS = (
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
    3600,
    7200,
)


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


class CopyMetrics:
    """The integrity-checker's copies of valid checkpoints on replicas (tiers that replicate)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.service = metrics.service
        self.bytes = Counter(
            "ckpt_ha_copy_bytes_total",
            "Bytes written to replicas by copies of valid checkpoints.",
            ["service"],
            registry=metrics.registry,
        )
        self.copies = Counter(
            "ckpt_ha_copies_total",
            "Copies of checkpoints verified on a replica, by outcome: valid, corrupt (a copy or "
            "a scrub of it found it damaged) or missing (a scrub found it gone).",
            ["service", "outcome"],
            registry=metrics.registry,
        )
        self.lag = Gauge(
            "ckpt_ha_replication_lag_seconds",
            "Age of the oldest valid checkpoint of the tier still lacking its copy on the "
            "tier's replica (0: every copy is made), as of the last copy round.",
            ["service", "tier"],
            registry=metrics.registry,
        )
        self.rpo = Gauge(
            "ckpt_ha_replication_rpo_seconds",
            "The tier's recovery-point objective for its copies (`Tier.copy_rpo_s`), for each "
            "tier this process copies.",
            ["service", "tier"],
            registry=metrics.registry,
        )
        self.all_lost = Counter(
            "ckpt_ha_copies_all_lost_total",
            "Checkpoints a scrub found with every copy gone or damaged, the primary included "
            "(all copies lost: it pages).",
            ["service"],
            registry=metrics.registry,
        )
        self.interrupted = Counter(
            "ckpt_ha_copy_interrupted_total",
            "Copy rounds cut short by a storage or registry outage (resumed next round).",
            ["service"],
            registry=metrics.registry,
        )
        self.read_bytes = Counter(
            "ckpt_ha_copy_read_bytes_total",
            "Bytes the copies read (the primary's files and the copy's verification).",
            ["service"],
            registry=metrics.registry,
        )
        self.throttled = Counter(
            "ckpt_ha_copy_throttle_wait_seconds_total",
            "Seconds the copies' reads waited for their read budget (copy_bytes_per_s).",
            ["service"],
            registry=metrics.registry,
        )

    def read(self, n: int) -> None:
        self.read_bytes.labels(self.service).inc(n)

    def waited(self, seconds: float) -> None:
        self.throttled.labels(self.service).inc(seconds)
