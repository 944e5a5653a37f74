"""The restore-coordinator's metrics: its decisions, verdicts, resume outcomes and durations,
escalations, lost attempts, and per-job series (restarts, failures, last progress, last
outcome). Built on the shared plumbing of `ckpt_ha.telemetry.metrics` (one registry per process,
bounded per-job gauges)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Histogram

from ckpt_ha.restore_coordinator.records import Attention
from ckpt_ha.telemetry.metrics import FORGET_AFTER_S, JobGauges, ServiceMetrics

RESUME_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
RESTART_WINDOW_S = 3600.0
"""`ckpt_ha_job_recent_restarts` counts the restarts planned within this many seconds (the
window of `CkptHaRestartLoop`'s threshold)."""


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

        self.attention = JobGauges(
            "ckpt_ha_job_attention_since_timestamp_seconds",
            "Jobs that need someone, by status (escalated by reason, lost, diverged, "
            "load_failed), since when (Unix time): read from the coordinator's stored state, "
            "so every replica exports the same; a job leaves when an operator acts (hold, "
            "restore, a new start) or it recovers (verified resume, run ended).",
            ["status", "reason"],
            forget_after_s=float("inf"),
            registry=reg,
        )

        self.recent_restarts = JobGauges(
            "ckpt_ha_job_recent_restarts",
            "Automatic restarts planned for a job in the last hour, read from the coordinator's "
            "stored decisions: every replica exports the same, whichever planned them, and a "
            "replica's restart loses none (what CkptHaRestartLoop counts).",
            [],
            forget_after_s=float("inf"),
            registry=reg,
        )

    def restarts_in_window(self, counts: Mapping[str, int]) -> None:
        """The stored restarts per job within `RESTART_WINDOW_S`, as read now."""
        self.recent_restarts.replace({(job,): float(n) for job, n in counts.items()})

    def attentions(self, records: Iterable[Attention]) -> None:
        """The stored attention records, as read now."""
        self.attention.replace(
            {(a.job_id, a.status, a.reason): a.since.timestamp() for a in records}
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
