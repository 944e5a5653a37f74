"""Tombstones leave the registry's hot index for the archive (R6, issue 33): only deleted
records older than the hot period, written to the archive before they leave the registry, so
that a failure in between leaves a tombstone in both places and never in neither. Against the
in-memory registry and a real filesystem archive; the Redis side is
``tests/integration/test_tombstone_archive.py``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord, Tombstone
from ckpt_ha.retention_janitor import domain
from ckpt_ha.retention_janitor.archive import StoreArchive, open_archive, pointer_key, record_key
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.resumes import InMemoryResumes, SettableFeed

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOT = timedelta(days=30)


def record(cid: str, state: CheckpointState, deleted_days_ago: float | None = None,
           job: str = "job/a") -> CheckpointRecord:  # fmt: skip
    t0 = NOW - timedelta(days=90)
    tombstone = (
        Tombstone(
            reason="expired by tier",
            actor="retention-janitor",
            event_id=f"e-{cid}",
            at=NOW - timedelta(days=deleted_days_ago),
        )
        if deleted_days_ago is not None
        else None
    )
    return CheckpointRecord(
        checkpoint_id=cid, job_id=job, step=1, uri=f"file:///s/{cid}", state=state,
        created_at=t0, updated_at=t0, tombstone=tombstone, checksums={"shard-0": "sha256:00"},
    )  # fmt: skip


def test_only_tombstones_older_than_the_hot_period_are_cold() -> None:
    old = record("old", CheckpointState.DELETED, 31)
    older = record("older", CheckpointState.DELETED, 40)
    recent = record("recent", CheckpointState.DELETED, 29)
    expired = record("expired", CheckpointState.EXPIRED)
    cold = domain.cold_tombstones([old, recent, expired, older], NOW, HOT)
    assert [r.checkpoint_id for r in cold] == ["older", "old"], "oldest deletion first"
    assert domain.cold_tombstones([old, older], NOW, timedelta(0)) == [], "0: never moved"


class BrokenArchive:
    """An archive whose storage is down: nothing may leave the registry."""

    async def put(self, records: Sequence[CheckpointRecord]) -> None:
        raise OSError("archive storage unreachable")

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        return None

    async def by_job(self, job_id: str) -> list[CheckpointRecord]:
        return []

    async def everything(self) -> list[CheckpointRecord]:
        return []


def janitor(registry: InMemoryRegistry, archive: object) -> Janitor:
    return Janitor(
        registry, InMemoryResumes(), SettableFeed(), FsStore("/"), RecordingPublisher(),
        lambda: NOW, RetentionMetrics(ServiceMetrics("retention-janitor")),
        archive=archive, hot=HOT,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture
def archive(tmp_path: Path) -> StoreArchive:
    found = open_archive(str(tmp_path / "tombstones"), create=True)
    assert found is not None
    return found


async def test_cold_tombstones_move_to_the_archive_and_stay_readable(
    archive: StoreArchive,
) -> None:
    registry = InMemoryRegistry()
    cold = [record(f"c{i}", CheckpointState.DELETED, 31 + i) for i in range(3)]
    other_job = record("c-other", CheckpointState.DELETED, 45, job="job-b")
    kept = [record("hot", CheckpointState.DELETED, 1), record("exp", CheckpointState.EXPIRED)]
    registry.put(*cold, other_job, *kept)

    moved = await janitor(registry, archive).move_cold_tombstones()

    assert sorted(moved) == ["c-other", "c0", "c1", "c2"]
    assert sorted(registry.records) == ["exp", "hot"], "only cold tombstones left the registry"
    assert await archive.get("c1") == cold[1], "the whole record: reason, actor, time, checksums"
    assert await archive.by_job("job/a") == cold
    assert [r.checkpoint_id for r in await archive.everything()] == ["c-other", "c0", "c1", "c2"]
    assert await archive.get("hot") is None
    # Ids are one key component each ('/' in a job id stays inside it).
    assert archive.store.stat(record_key("job/a", "c0")).size > 0
    assert archive.store.stat(pointer_key("c0")).size > 0
    assert await janitor(registry, archive).move_cold_tombstones() == [], "nothing left to move"


async def test_nothing_leaves_the_registry_unless_archived_first() -> None:
    registry = InMemoryRegistry()
    registry.put(record("c0", CheckpointState.DELETED, 60))
    with pytest.raises(OSError, match="unreachable"):
        await janitor(registry, BrokenArchive()).move_cold_tombstones()
    assert "c0" in registry.records, "the archive failed: the tombstone stays in the registry"


async def test_a_tombstone_changed_since_it_was_archived_stays_until_archived_again(
    archive: StoreArchive,
) -> None:
    registry = InMemoryRegistry()
    read = record("c0", CheckpointState.DELETED, 60)
    registry.put(read)
    changed = read.model_copy(update={"updated_at": NOW})  # e.g. a replica's copy recorded
    registry.put(changed)
    assert await registry.forget_tombstones([read]) == [], "compare-and-set: not what was read"
    assert await janitor(registry, archive).move_cold_tombstones() == ["c0"]
    assert await archive.get("c0") == changed, "the archive holds the newest document"


async def test_a_crash_after_archiving_leaves_the_tombstone_in_both_then_the_next_round_ends_it(
    archive: StoreArchive,
) -> None:
    registry = InMemoryRegistry()
    tomb = record("c0", CheckpointState.DELETED, 60)
    registry.put(tomb)
    await archive.put([tomb])  # the round wrote the archive, then died before removing it
    assert await registry.get("c0") == tomb
    assert await janitor(registry, archive).move_cold_tombstones() == ["c0"]
    assert await registry.get("c0") is None
    assert await archive.get("c0") == tomb


async def test_a_reader_sees_no_archive_where_none_was_written(tmp_path: Path) -> None:
    assert open_archive(str(tmp_path / "none-yet"), create=False) is None
    assert not (tmp_path / "none-yet").exists(), "a reader creates nothing"
    writer = open_archive(str(tmp_path / "none-yet"), create=True)
    assert writer is not None
    assert not (tmp_path / "none-yet").exists(), "nor a janitor with nothing to archive"
    await writer.put([record("c0", CheckpointState.DELETED, 60)])
    assert await writer.get("c0") is not None
