"""The retention-janitor's round against in-memory fakes of its ports and a real filesystem
store: expiry and deletion honour pins, restore plans and resumes in progress; deletion removes
the bytes before the tombstone; the declared tier is recorded. The same against the real
services: ``tests/integration/test_retention.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.contracts import EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.job import JobPolicy, JobStartedV1
from ckpt_ha.contracts.resume import (
    Compatibility,
    ResumeMode,
    ResumePlannedV2,
    ResumeVerifiedV1,
)
from ckpt_ha.core.records import CheckpointRecord, Expiry, PinRecord
from ckpt_ha.retention_janitor.handlers import Janitor, JanitorHandlers
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.resumes import InMemoryResumes, SettableFeed

JOB = "job-r"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=30)


def valid(store: FsStore, step: int, **update: Any) -> CheckpointRecord:
    key = f"{JOB}/step-{step:06d}"
    store.put(f"{key}/shard-0.bin", b"x" * 10)
    store.put(f"{key}/manifest.json", b"{}")
    r = CheckpointRecord(
        checkpoint_id=f"c{step}", job_id=JOB, run_id="run-1", step=step, uri=store.uri(key),
        state=CheckpointState.VALID, created_at=T0, updated_at=T0,
    )  # fmt: skip
    return r.model_copy(update=update)


def expired(store: FsStore, step: int, **update: Any) -> CheckpointRecord:
    expiry = Expiry(
        reason="old", policy="p", tier="exploratory", grace_until=NOW - timedelta(hours=1),
        actor="retention-janitor", at=NOW - timedelta(hours=2),
    )  # fmt: skip
    return valid(store, step, state=CheckpointState.EXPIRED, expiry=expiry, **update)


class World:
    def __init__(self, store: FsStore, *records: CheckpointRecord) -> None:
        self.registry = InMemoryRegistry()
        self.registry.put(*records)
        self.resumes = InMemoryResumes()
        self.bus = RecordingPublisher()
        self.store = store
        self.janitor = Janitor(
            self.registry, self.resumes, SettableFeed(), store, self.bus, lambda: NOW,
            RetentionMetrics(ServiceMetrics("retention-janitor")),
        )  # fmt: skip
        self.handlers = JanitorHandlers(self.janitor)
        self.n = 0

    async def consume(self, data: EventData) -> None:
        """What the coordinator and the runner publish, through the janitor's consumers."""
        self.n += 1
        event = build(
            data, source="test/coordinator", time=NOW - timedelta(hours=1), key=f"{self.n}"
        )
        if isinstance(data, JobStartedV1):
            await self.handlers.on_started(event)  # type: ignore[arg-type]
        else:
            await self.handlers.resumes.on_event(event)

    async def plan(
        self, plan_id: str, ckpt: str, attempt: int, *, resuming: bool, pinned: tuple[str, ...] = ()
    ) -> None:
        await self.consume(
            ResumePlannedV2(
                job_id=JOB, plan_id=plan_id, failed_run_id="run-1", attempt=attempt,
                checkpoint_id=ckpt, checkpoint_uri=f"file:///{ckpt}", step=600,
                mode=ResumeMode.EXACT, compatibility=Compatibility.IDENTICAL, pinned=pinned,
            )
        )  # fmt: skip
        if resuming:
            await self.consume(JobStartedV1(job_id=JOB, run_id="run-1", attempt=attempt,
                                            plan_id=plan_id))  # fmt: skip

    async def verdict(self, plan_id: str) -> None:
        await self.consume(
            ResumeVerifiedV1(job_id=JOB, plan_id=plan_id, run_id="run-1", checkpoint_id="c", step=1)
        )

    async def pin(self, ckpt: str, plan_id: str) -> None:
        """A verified resume's fallback, still pinned (R15): only the pin references it."""
        await self.plan(plan_id, "c-gone", 2, resuming=True, pinned=("c-gone", ckpt))
        await self.verdict(plan_id)

    def published(self, event_type: str) -> list[str]:
        return [e.data.checkpoint_id for e in self.bus.of_type(event_type)]  # type: ignore[attr-defined]


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    root = tmp_path / "storage"
    root.mkdir()
    return FsStore(root)


async def test_expiry_honours_pins_plans_and_resumes_in_progress(store: FsStore) -> None:
    world = World(store, *(valid(store, s) for s in (5, 10, 20, 30, 40, 50)))
    await world.pin("c10", "p-old")
    await world.plan("p-plan", "c20", 5, resuming=False)
    await world.plan("p-res", "c30", 4, resuming=True)
    await world.plan("p-done", "c5", 3, resuming=True)
    await world.verdict("p-done")  # decided: protects nothing anymore

    result = await world.janitor.run_once()

    assert result.expired == ["c5"]
    assert world.published("checkpoint.expired") == ["c5"]
    [event] = world.bus.of_type("checkpoint.expired")
    assert event.data.grace_until == NOW + timedelta(hours=1)  # type: ignore[attr-defined]
    kinds = {d.checkpoint_id: [p.kind.value for p in d.protected_by] for d in result.decisions}
    assert kinds == {
        "c50": ["last_valid"], "c40": [], "c30": ["resume"], "c20": ["restore_plan"],
        "c10": ["fallback"], "c5": [],
    }  # fmt: skip
    refs = {d.checkpoint_id: d.reason for d in result.decisions}
    assert "fallback for plan p-old" in refs["c10"]
    assert "attempt 4 of plan p-res" in refs["c30"]
    # The dry run is the same read and the same plan.
    dry = await world.janitor.dry_run()
    assert [(d.checkpoint_id, d.action) for d in dry] == [
        (d.checkpoint_id, d.action) for d in result.decisions
    ]


async def test_deletion_removes_the_bytes_then_publishes_the_tombstone(store: FsStore) -> None:
    world = World(store, valid(store, 40), valid(store, 50), expired(store, 5), expired(store, 6),
                  expired(store, 7), expired(store, 8))  # fmt: skip
    held = PinRecord(by="eval:mmlu", reason="baseline", actor="alice", at=T0, event_id="e")
    world.registry.put(expired(store, 6, pins=(held,)))  # pinned in the record
    await world.pin("c7", "p-x")  # pinned by a resume
    await world.plan("p-plan", "c8", 3, resuming=False)  # referenced by a plan

    result = await world.janitor.run_once()

    assert result.deleted == ["c5"]
    assert world.published("checkpoint.deleted") == ["c5"]
    [event] = world.bus.of_type("checkpoint.deleted")
    assert event.data.objects_deleted == 2  # type: ignore[attr-defined]
    assert list(store.list(f"{JOB}/step-000005")) == []
    for kept in (6, 7, 8, 40, 50):
        assert store.exists(f"{JOB}/step-{kept:06d}/shard-0.bin")


async def test_a_deletion_outside_the_store_root_is_never_reported_done(store: FsStore) -> None:
    away = expired(store, 5).model_copy(update={"uri": "s3://elsewhere/job-r/step-5"})
    world = World(store, valid(store, 40), valid(store, 50), away)
    result = await world.janitor.run_once()
    assert result.deleted == []
    assert "outside this janitor's storage root" in result.failed["c5"]
    assert world.bus.of_type("checkpoint.deleted") == []


async def test_a_storage_outage_stops_deleting_and_a_later_round_completes(
    store: FsStore, tmp_path: Path
) -> None:
    world = World(store, valid(store, 40), valid(store, 50), expired(store, 5), expired(store, 6))
    root, away = tmp_path / "storage", tmp_path / "unmounted"
    root.rename(away)
    try:
        result = await world.janitor.run_once()
    finally:
        away.rename(root)
    assert result.deleted == []
    assert set(result.failed) == {"c5", "c6"}
    assert world.bus.of_type("checkpoint.deleted") == []
    result = await world.janitor.run_once()
    assert sorted(result.deleted) == ["c5", "c6"]


async def test_the_tier_a_job_declares_at_start_is_recorded(store: FsStore) -> None:
    world = World(store, valid(store, 1))
    handlers = JanitorHandlers(world.janitor)
    data = JobStartedV1(job_id=JOB, run_id="r2", policy=JobPolicy(tier="standard"))
    await handlers.on_started(build(data, source="test/runner", time=T0, key="s"))
    assert (await world.registry.tier_of(JOB)).tier.name == "standard"
    data = JobStartedV1(job_id=JOB, run_id="r3")
    await handlers.on_started(build(data, source="test/runner", time=T0, key="s3"))
    assert (await world.registry.tier_of(JOB)).source == "default"
