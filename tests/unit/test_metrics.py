"""Metrics stay bounded and say what happened: reason classes, per-job series that forget idle
jobs, what the registrar counts for each applied event, the coordinator's resume outcomes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import generate_latest

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointQuarantinedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    FailureSide,
)
from ckpt_ha.core.records import Applied, project
from ckpt_ha.registrar.metrics import LifecycleMetrics, reason_class
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.runtime.server import bounded_subject
from ckpt_ha.telemetry.metrics import CounterChildren, JobGauges, ServiceMetrics
from tests.support.events import T0, committed, verified


def sample(metrics: ServiceMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_free_text_reasons_map_to_a_few_classes() -> None:
    assert reason_class("corrupt: shard 3 checksum mismatch") == "corrupt"
    assert reason_class("incomplete: manifest names a missing file") == "incomplete"
    assert reason_class("load failed: unexpected EOF") == "load_failed"
    assert reason_class("scrub: a.npy: checksum changed") == "scrub"
    assert reason_class("write stalled for 0:10:00; missing ['a']") == "stalled"
    assert reason_class("files missing after commit: ['x']") == "files_missing"
    assert reason_class("anything a human typed, job-42 ckpt-abc") == "other"


def test_job_gauges_forget_a_job_and_drop_idle_ones() -> None:
    now = [1000.0]
    metrics = ServiceMetrics("svc")
    gauges = JobGauges(
        "t_last", "test", ["outcome"], forget_after_s=60, now=lambda: now[0],
        registry=metrics.registry,
    )  # fmt: skip
    gauges.set("a", "planned", value=5)
    gauges.set("b", "planned", value=7)
    gauges.set_max("b", "planned", value=6)
    assert sample(metrics, "t_last", job_id="b", outcome="planned") == 7
    gauges.forget("a")
    assert sample(metrics, "t_last", job_id="a", outcome="planned") is None
    now[0] += 61
    assert sample(metrics, "t_last", job_id="b", outcome="planned") is None


def test_per_job_counters_are_exposed_as_counters() -> None:
    metrics = ServiceMetrics("restore-coordinator")
    restore = RestoreMetrics(metrics)
    restore.job_started("j")
    assert sample(metrics, "ckpt_ha_job_restarts_total", job_id="j") == 0
    restore.outcome("j", "planned", at=T0.timestamp(), seconds=12.0)
    restore.outcome("j", "planned", at=T0.timestamp(), seconds=3.0)
    restore.outcome("j", "escalated", at=T0.timestamp(), reason="restart_loop")
    assert sample(metrics, "ckpt_ha_job_restarts_total", job_id="j") == 2
    assert sample(metrics, "ckpt_ha_escalations_total", service="restore-coordinator",
                  reason="restart_loop") == 1  # fmt: skip
    assert sample(metrics, "ckpt_ha_resume_duration_seconds_count",
                  service="restore-coordinator", stage="planned") == 2  # fmt: skip
    last = sample(metrics, "ckpt_ha_resume_last_outcome_timestamp_seconds",
                  job_id="j", outcome="escalated", reason="restart_loop")  # fmt: skip
    assert last == T0.timestamp()
    assert b"# TYPE ckpt_ha_job_restarts_total counter" in generate_latest(metrics.registry)


def test_the_registrar_counts_states_recovery_point_and_corruption_without_ids() -> None:
    metrics = ServiceMetrics("registrar")
    life = LifecycleMetrics(metrics)

    def apply(record: object, event: object) -> object:
        new, step = project(record, event)  # type: ignore[arg-type]
        life.observe(event, Applied(new, step, duplicate=False))  # type: ignore[arg-type]
        return new

    record = apply(None, committed("c1", step=100))
    record = apply(record, verified("c1"))
    assert sample(metrics, "ckpt_ha_checkpoint_states_total", service="registrar",
                  state="valid", format="native") == 1  # fmt: skip
    assert sample(metrics, "ckpt_ha_last_valid_checkpoint_timestamp_seconds",
                  job_id="job-1") == T0.timestamp()  # fmt: skip
    assert (sample(metrics, "ckpt_ha_recovery_point_age_seconds", job_id="job-1") or 0) > 0
    # Committed at T0, verified 5 s later: one observation of the committed-to-valid SLI.
    assert sample(metrics, "ckpt_ha_commit_to_valid_seconds_sum", service="registrar") == 5
    assert sample(metrics, "ckpt_ha_commit_to_valid_seconds_bucket", service="registrar",
                  le="5.0") == 1  # fmt: skip
    assert sample(metrics, "ckpt_ha_commit_to_valid_seconds_bucket", service="registrar",
                  le="1.0") == 0  # fmt: skip

    # A failed load quarantines the valid checkpoint automatically: that is corruption.
    quarantined = CheckpointQuarantinedV1(job_id="job-1", checkpoint_id="c1",
                                          uri="file:///data/job-1/step-100",
                                          reason="load failed: truncated shard")  # fmt: skip
    apply(record, build(quarantined, source="test", time=T0, key="q"))
    assert sample(metrics, "ckpt_ha_checkpoint_corrupt_total", service="registrar",
                  reason="load_failed", side="unknown") == 1  # fmt: skip
    assert sample(metrics, "ckpt_ha_last_corrupt_checkpoint_step", job_id="job-1") == 100
    assert sample(metrics, "ckpt_ha_checkpoint_quarantined_total", service="registrar",
                  by="automatic") == 1  # fmt: skip

    exposition = generate_latest(metrics.registry).decode()
    assert "c1" not in exposition


def test_open_writes_come_from_the_registry_records_and_a_corrupt_verdict_counts() -> None:
    """Two replicas reading the same writing records export the same oldest start per job,
    whichever of them applied the write's events; a write gone from the records is gone."""
    replicas = [ServiceMetrics("registrar"), ServiceMetrics("registrar")]
    lives = [LifecycleMetrics(m) for m in replicas]
    writing = build(CheckpointWritingV1(job_id="j", checkpoint_id="w1", uri="file:///d/j/s1",
                                        run_id="r"), source="t", time=T0, key="w")  # fmt: skip
    record, step = project(None, writing)
    assert record is not None
    lives[0].observe(writing, Applied(record, step, duplicate=False))  # replica a applied it
    later = record.model_copy(
        update={"checkpoint_id": "w2", "created_at": record.created_at + timedelta(minutes=5)}
    )
    for life in lives:
        life.open_writes([later, record])
    for metrics in replicas:
        assert sample(metrics, "ckpt_ha_checkpoint_write_oldest_started_timestamp_seconds",
                      job_id="j") == record.created_at.timestamp()  # fmt: skip
    metrics, life = replicas[1], lives[1]
    failed = build(CheckpointWriteFailedV1(job_id="j", checkpoint_id="w1", uri="file:///d/j/s1",
                                           reason="write stalled for 0:05:00; missing []",
                                           side=FailureSide.JOB),
                   source="t", time=T0, key="f")  # fmt: skip
    record, step = project(record, failed)
    life.observe(failed, Applied(record, step, duplicate=False))  # replica b applied this one
    life.open_writes([])
    assert sample(metrics, "ckpt_ha_checkpoint_write_oldest_started_timestamp_seconds",
                  job_id="j") is None  # fmt: skip
    assert sample(metrics, "ckpt_ha_checkpoint_write_failures_total", service="registrar",
                  side="job", reason="stalled") == 1  # fmt: skip

    record, step = project(None, committed("c2", job="k", step=7))
    corrupt = build(CheckpointCorruptV1(job_id="k", checkpoint_id="c2", uri="file:///d/k/7",
                                        reason="corrupt: checksum mismatch in a.npy",
                                        side=FailureSide.INFRASTRUCTURE),
                    source="t", time=T0, key="c")  # fmt: skip
    record, step = project(record, corrupt)
    life.observe(corrupt, Applied(record, step, duplicate=False))
    assert sample(metrics, "ckpt_ha_checkpoint_corrupt_total", service="registrar",
                  reason="corrupt", side="infrastructure") == 1  # fmt: skip
    assert sample(metrics, "ckpt_ha_last_corrupt_checkpoint_step", job_id="k") == 7


def test_faststream_metrics_label_subjects_without_the_job() -> None:
    assert bounded_subject("ckpt.ev.checkpoint.committed.v1.job-7") == (
        "ckpt.ev.checkpoint.committed.v1.*"
    )
    assert bounded_subject("ckpt.dlq.registrar.checkpoints") == "ckpt.dlq.registrar.checkpoints"


def test_seeding_from_the_registry_skips_jobs_idle_past_the_forget_time() -> None:
    metrics = ServiceMetrics("registrar")
    life = LifecycleMetrics(metrics, forget_after_s=3600)
    fresh, _ = project(None, committed("c1", job="fresh"))
    fresh, _ = project(fresh, verified("c1", job="fresh"))
    assert fresh is not None
    now = datetime.now(UTC)
    recent = fresh.model_copy(update={"created_at": now, "updated_at": now})
    old = fresh.model_copy(update={"job_id": "old", "updated_at": now - timedelta(hours=2)})
    life.seed([recent, old])
    assert sample(metrics, "ckpt_ha_last_valid_checkpoint_timestamp_seconds",
                  job_id="fresh") == now.timestamp()  # fmt: skip
    assert sample(metrics, "ckpt_ha_last_valid_checkpoint_timestamp_seconds", job_id="old") is None


def test_counter_children_count_into_the_labelled_series() -> None:
    """A child looked up once keeps counting into the counter's series, per label set."""
    metrics = ServiceMetrics("registrar")
    for _ in range(3):
        metrics.message("checkpoints", "ack")
    metrics.message("checkpoints", "nak")
    metrics.transition("none", "pending_verification")
    children = CounterChildren(metrics.messages)
    children.inc("registrar", "checkpoints", "ack")
    text = generate_latest(metrics.registry).decode()
    assert (
        'ckpt_ha_messages_total{consumer="checkpoints",outcome="ack",service="registrar"} 4.0'
        in text
    )
    assert (
        'ckpt_ha_messages_total{consumer="checkpoints",outcome="nak",service="registrar"} 1.0'
        in text
    )
    assert (
        'ckpt_ha_checkpoint_transitions_total{from_state="none",service="registrar",'
        'to_state="pending_verification"} 1.0' in text
    )
