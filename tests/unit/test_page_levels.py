"""The levels the per-job pages rest on, computed from stored state so that every replica exports
the same whichever handled the events: checkpoints awaiting review (from the registry's records),
restarts in the last hour (from the coordinator's stored plans), and each tier's recovery-point
objective."""

from __future__ import annotations

from datetime import timedelta

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCorruptV1,
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    FailureSide,
)
from ckpt_ha.core.corruption import awaiting_review
from ckpt_ha.core.records import CheckpointRecord, project
from ckpt_ha.core.tiers import TIERS
from ckpt_ha.registrar.metrics import LifecycleMetrics
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.events import T0, committed, verified

CHECKER = "ckpt-ha/integrity-checker"
URI = "file:///data/job-1/step-100"


def step(record: CheckpointRecord | None, data: object, source: str = CHECKER) -> CheckpointRecord:
    at = T0 + timedelta(seconds=len(record.history) if record else 0)
    new, _ = project(record, build(data, source=source, time=at, key=str(at)))  # type: ignore[arg-type]
    assert new is not None
    return new


def valid(ckpt: str = "c1", job: str = "job-1") -> CheckpointRecord:
    record, _ = project(None, committed(ckpt, job=job))
    assert record is not None
    record, _ = project(record, verified(ckpt, job=job))
    assert record is not None
    return record


def quarantined(ckpt: str = "c1", job: str = "job-1", actor: str | None = None) -> object:
    return CheckpointQuarantinedV1(
        job_id=job, checkpoint_id=ckpt, uri=URI, reason="load failed: bad shard", actor=actor
    )


def test_a_checkpoint_found_corrupt_awaits_review_until_a_person_acts() -> None:
    record = valid()
    assert not awaiting_review(record)
    corrupt = CheckpointCorruptV1(job_id="job-1", checkpoint_id="c1", uri=URI,
                                  reason="scrub: checksum mismatch",
                                  side=FailureSide.INFRASTRUCTURE)  # fmt: skip
    found = step(record, corrupt)
    assert awaiting_review(found)
    isolated = step(found, quarantined())
    assert awaiting_review(isolated)
    # Released by a person: back to verification, nothing awaits review any more.
    released = step(isolated, CheckpointReleasedV1(job_id="job-1", checkpoint_id="c1", uri=URI,
                                                   reason="bytes fixed", actor="alice"),
                    source="ckpt-ha/cli")  # fmt: skip
    assert not awaiting_review(released)
    # A failed load of a valid checkpoint quarantines it automatically: it awaits review.
    assert awaiting_review(step(valid(), quarantined()))


def test_a_person_keeping_it_quarantined_ends_the_review_and_a_pin_does_not() -> None:
    isolated = step(valid(), quarantined())
    assert awaiting_review(isolated)
    # An operator's act leaves a history entry on a person: a pin is no review.
    pin = CheckpointPinnedV1(
        job_id="job-1", checkpoint_id="c1", uri=URI, by="eval:x", reason="a look", actor="bob"
    )
    pinned = step(isolated, pin, source="ckpt-ha/cli")
    assert awaiting_review(pinned)
    # "Reviewed, keep it quarantined": the same quarantine again, by a person. The lifecycle
    # does not move; the history names the person, so the quarantine is theirs.
    kept = step(pinned, quarantined(actor="alice"), source="ckpt-ha/cli")
    assert kept.state.value == "quarantined"
    assert (kept.history[-1].actor, kept.history[-1].state.value) == ("alice", "quarantined")
    assert kept.history[-1].reason == "kept quarantined after review: load failed: bad shard"
    assert not awaiting_review(kept)
    # An automatic quarantine heard again changes nothing (no entry, no page again).
    again = step(kept, quarantined())
    assert again.history == kept.history
    assert not awaiting_review(again)


def test_quarantines_a_person_decided_or_of_partial_writes_await_no_one() -> None:
    by_hand = step(valid(), quarantined(actor="alice"), source="ckpt-ha/cli")
    assert not awaiting_review(by_hand)
    writing = CheckpointWritingV1(job_id="job-1", checkpoint_id="w1", uri=URI, run_id="r")
    failed = CheckpointWriteFailedV1(job_id="job-1", checkpoint_id="w1", uri=URI,
                                     reason="write stalled", side=FailureSide.JOB)  # fmt: skip
    partial = step(step(step(None, writing, "ckpt-ha/writer-watcher"), failed), quarantined("w1"))
    assert partial.state.value == "quarantined"
    assert not awaiting_review(partial)


def test_two_registrar_replicas_export_the_same_count_per_job_from_the_records() -> None:
    records = [
        step(valid("c1"), quarantined("c1")),
        step(valid("c2"), quarantined("c2")),
        step(valid("c3"), quarantined("c3", actor="alice"), source="ckpt-ha/cli"),
        step(valid("c4", job="job-2"), quarantined("c4", job="job-2")),
    ]
    replicas = [ServiceMetrics("registrar"), ServiceMetrics("registrar")]
    lives = [LifecycleMetrics(m) for m in replicas]
    for life in lives:
        life.to_review(records)
    for metrics in replicas:
        get = metrics.registry.get_sample_value
        assert get("ckpt_ha_checkpoints_awaiting_review", {"job_id": "job-1"}) == 2
        assert get("ckpt_ha_checkpoints_awaiting_review", {"job_id": "job-2"}) == 1
        # What the page names: the newest step awaiting review (the commits' step 100).
        assert get("ckpt_ha_checkpoint_awaiting_review_newest_step", {"job_id": "job-1"}) == 100
    lives[0].to_review(records[:1])  # the others released or expired: their job leaves
    get = replicas[0].registry.get_sample_value
    assert get("ckpt_ha_checkpoints_awaiting_review", {"job_id": "job-1"}) == 1
    assert get("ckpt_ha_checkpoints_awaiting_review", {"job_id": "job-2"}) is None
    assert get("ckpt_ha_checkpoint_awaiting_review_newest_step", {"job_id": "job-2"}) is None


def test_the_coordinator_exports_the_stored_restarts_of_the_hour() -> None:
    metrics = ServiceMetrics("restore-coordinator")
    restores = RestoreMetrics(metrics)
    restores.restarts_in_window({"job-1": 3, "job-2": 1})
    get = metrics.registry.get_sample_value
    assert get("ckpt_ha_job_recent_restarts", {"job_id": "job-1"}) == 3
    restores.restarts_in_window({"job-2": 1})
    assert get("ckpt_ha_job_recent_restarts", {"job_id": "job-1"}) is None
    assert get("ckpt_ha_job_recent_restarts", {"job_id": "job-2"}) == 1


def test_each_tiers_recovery_point_objective_is_exported_and_jobs_name_their_tier() -> None:
    metrics = ServiceMetrics("retention-janitor")
    retention = RetentionMetrics(metrics)
    get = metrics.registry.get_sample_value
    for tier in TIERS.values():
        labels = {"service": "retention-janitor", "tier": tier.name}
        assert get("ckpt_ha_tier_rpo_seconds", labels) == tier.rpo_s
        # One slow or failed checkpoint does not page: at least two intervals.
        assert tier.rpo_s >= 2 * tier.interval_s
    retention.job_tier.replace({("job-1", "critical"): 1.0})
    assert get("ckpt_ha_job_tier", {"job_id": "job-1", "tier": "critical"}) == 1
