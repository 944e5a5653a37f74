"""The retention-janitor's metrics (registered in the process's registry of
`ckpt_ha.telemetry.metrics.ServiceMetrics`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from ckpt_ha.core.tiers import TIERS
from ckpt_ha.telemetry.metrics import JobGauges, ServiceMetrics


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
        self.tier_rpo = Gauge(
            "ckpt_ha_tier_rpo_seconds",
            "Each protection tier's recovery-point objective (`Tier.rpo_s`): a running job's "
            "newest valid checkpoint is never older than this.",
            ["service", "tier"],
            registry=metrics.registry,
        )
        for tier in TIERS.values():
            self.tier_rpo.labels(self.service, tier.name).set(tier.rpo_s)
        self.job_tier = JobGauges(
            "ckpt_ha_job_tier",
            "1 for each job with checkpoints not yet deleted and its protection tier (set by "
            "each full retention round): joined with ckpt_ha_tier_rpo_seconds, the job's "
            "recovery-point objective.",
            ["tier"],
            forget_after_s=float("inf"),
            registry=metrics.registry,
        )
        self.archived = Counter(
            "ckpt_ha_retention_tombstones_archived_total",
            "Tombstones moved from the registry (Redis) to the tombstone archive after "
            "CKPT_HA_TOMBSTONE_HOT_DAYS.",
            ["service"],
            registry=metrics.registry,
        )
