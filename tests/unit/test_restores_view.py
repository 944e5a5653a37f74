"""`ckpt-ha restores`: a job's decisions as on-call reads them."""

from __future__ import annotations

from datetime import UTC, datetime

from ckpt_ha.contracts import build
from ckpt_ha.contracts.resume import (
    Comparison,
    LoadBlame,
    ResumeEscalatedV2,
    ResumeLoadFailedV2,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.ops import restores

T = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def test_each_decision_reads_as_one_entry_with_its_reasons() -> None:
    planned = ResumePlannedV2(
        job_id="j", plan_id="p1", failed_run_id="r", attempt=2, checkpoint_id="j-c2",
        checkpoint_uri="file:///s/j/step-2", step=200, mode="exact_resume",
        compatibility="identical", recompute_steps=7, recompute_seconds=3.5,
        reasons=("identity the checkpoint does not record taken from attempt 1's job.started",),
    )  # fmt: skip
    failed = ResumeLoadFailedV2(
        job_id="j", plan_id="p1", run_id="r", checkpoint_id="j-c2", reason="shard 1: checksum",
        blame=LoadBlame.CHECKPOINT, rank=1,
    )  # fmt: skip
    escalated = ResumeEscalatedV2(
        job_id="j", plan_id="p2", reason="compatibility_unknown",
        next_step="docs/RUNBOOK.md#prepare-environment: prepare the restore environment",
        detail="compatibility unknown restoring j-c1: code_version: a -> b (no declared rule); "
        "topology: 2/1/1 -> 4/1/1 (no declared rule)",
    )  # fmt: skip
    verified = ResumeVerifiedV1(
        job_id="j", plan_id="p1", run_id="r", checkpoint_id="j-c2", step=201,
        comparisons=(Comparison(name="loss", expected=0.5, observed=0.51, ok=True),),
    )  # fmt: skip
    events = [build(d, source="t", time=T, key="k") for d in (planned, failed, escalated, verified)]
    entries = restores.history(events)
    assert [e.kind for e in entries] == ["planned", "load_failed", "escalated", "verified"]
    assert entries[0].summary == (
        "attempt 2 to restore j-c2 at step 200 (exact_resume, compatibility identical)"
    )
    assert entries[0].details == (planned.reasons[0], "recompute: 7 steps, 3.5 s")
    assert entries[1].summary == "j-c2 failed to load on rank 1 (blames the checkpoint)"
    assert entries[2].details == (
        "compatibility unknown restoring j-c1:",
        "  code_version: a -> b (no declared rule)",
        "  topology: 2/1/1 -> 4/1/1 (no declared rule)",
        "next step: docs/RUNBOOK.md#prepare-environment: prepare the restore environment",
    )
    assert entries[3].details == ("loss: expected 0.5, observed 0.51 (ok)",)
    assert entries[3].to_json()["plan_id"] == "p1"
