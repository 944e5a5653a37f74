"""Prometheus metrics shared by every service (one registry per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


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
        self.up = Gauge(
            "ckpt_ha_service_up", "1 while the service runs.", ["service"], registry=self.registry
        )

    def message(self, consumer: str, outcome: str) -> None:
        self.messages.labels(self.service, consumer, outcome).inc()


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
            "When the last complete scrub round finished (Unix time).",
            ["service"],
            registry=metrics.registry,
        )


class RestoreMetrics:
    """The restore-coordinator's decisions: plans by mode, escalations by reason, verdicts."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.service = metrics.service
        self.decisions = Counter(
            "ckpt_ha_restore_decisions_total",
            "Failures decided: planned (by mode) or escalated (by reason).",
            ["service", "outcome", "detail"],
            registry=metrics.registry,
        )
        self.verdicts = Counter(
            "ckpt_ha_resume_verdicts_total",
            "Continuity verdicts after a resume (verified, diverged).",
            ["service", "verdict"],
            registry=metrics.registry,
        )
        self.reclaimed = Counter(
            "ckpt_ha_resume_leftovers_total",
            "Leftovers of failed attempts after a verified resume (cleaned, unreclaimable).",
            ["service", "outcome"],
            registry=metrics.registry,
        )


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
