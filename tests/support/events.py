"""Builders for realistic events in tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointVerifiedV1,
)
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

DATA_ROOT = "/data"
"""The storage root these events' locations lie in (``file:///data/<job>/step-<n>``): the test
settings' storage root, so a real registrar takes them (a location must be its job's)."""


def committed(
    ckpt: str,
    job: str = "job-1",
    step: int = 100,
    uri: str | None = None,
    key: str = "k",
    project: str | None = None,
    traceparent: str | None = None,
    attempt: int | None = None,
    run: str = "run-1",
) -> Envelope[EventData]:
    """``project`` or ``attempt`` given: the commit declares an identity (of run ``run``)."""
    identity = None
    if project is not None or attempt is not None:
        identity = CheckpointIdentity(
            job_id=job,
            run_id=run,
            attempt=attempt or 1,
            code_version="abc123",
            project=project,
            created_at=T0,
        )
    return build(
        CheckpointCommittedV1(
            job_id=job,
            checkpoint_id=ckpt,
            uri=uri or f"file://{DATA_ROOT}/{job}/step-{step}",
            run_id=run,
            step=step,
            format=CheckpointFormat.NATIVE,
            identity=identity,
            shard_count=2,
            total_bytes=2048,
        ),
        source="test/watcher",
        time=T0,
        key=key,
        traceparent=traceparent,
    )


def verified(ckpt: str, job: str = "job-1", step: int = 100, key: str = "k") -> Envelope[EventData]:
    return build(
        CheckpointVerifiedV1(
            job_id=job,
            checkpoint_id=ckpt,
            uri=f"file://{DATA_ROOT}/{job}/step-{step}",
            checks=("manifest", "sizes", "crc32c"),
        ),
        source="test/checker",
        time=T0 + timedelta(seconds=5),
        key=key,
    )


def expired(ckpt: str, job: str = "job-1", key: str = "k") -> Envelope[EventData]:
    return build(
        CheckpointExpiredV1(
            job_id=job, checkpoint_id=ckpt, uri="file:///x", reason="age", policy="standard"
        ),
        source="test/janitor",
        time=T0 + timedelta(days=1),
        key=key,
    )


def deleted(ckpt: str, job: str = "job-1", key: str = "k") -> Envelope[EventData]:
    return build(
        CheckpointDeletedV1(
            job_id=job, checkpoint_id=ckpt, uri="file:///x", reason="age", actor="janitor"
        ),
        source="test/janitor",
        time=T0 + timedelta(days=2),
        key=key,
    )


def planned(
    job: str = "job-1", attempt: int = 2, run: str = "run-1", key: str = "k"
) -> Envelope[EventData]:
    """The coordinator's plan for ``attempt`` of ``run`` (it answers attempt - 1's failure)."""
    return build(
        ResumePlannedV2(
            job_id=job,
            plan_id=f"plan-{job}-{run}-{attempt}",
            failed_run_id=run,
            attempt=attempt,
            checkpoint_id="c-restore",
            checkpoint_uri=f"file://{DATA_ROOT}/{job}/step-50",
            step=50,
            mode=ResumeMode.EXACT,
            compatibility=Compatibility.IDENTICAL,
        ),
        source="test/coordinator",
        time=T0,
        key=key,
    )
