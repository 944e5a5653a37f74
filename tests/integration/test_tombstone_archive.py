"""Tombstones move from the registry in a real Redis to a real archive (a filesystem and a moto
S3 bucket), and `retention audit` still reads them there (R6, issue 33). The removal is a
compare-and-set on the record as archived; the unit side is
``tests/unit/test_tombstone_archive.py``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.ops import audit
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor.archive import StoreArchive, open_archive
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore, S3Store
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.events import T0, committed, deleted, expired, verified
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.resumes import InMemoryResumes, SettableFeed
from tests.support.moto_server import s3_client, start_moto_server

pytestmark = pytest.mark.integration

NOW = T0 + timedelta(days=40)
"""The tombstones of `tests.support.events.deleted` are 38 days old then."""


@pytest.fixture
async def registry(settings: ServiceSettings) -> AsyncIterator[Registry]:
    reg = Registry.from_url(settings.redis_url, settings.registry_prefix)
    yield reg
    await reg.close()


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    endpoint, stop = start_moto_server()
    yield endpoint
    stop()


@pytest.fixture(params=["fs", "s3"])
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> StoreArchive:
    if request.param == "fs":
        found = open_archive(str(tmp_path / "tombstones"), create=True)
        assert found is not None
        return found
    client = s3_client(request.getfixturevalue("moto_endpoint"))
    bucket = f"tomb-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return StoreArchive(S3Store(bucket, prefix="tombstones", client=client))


async def life(registry: Registry, ckpt: str, job: str, *, gone: bool) -> None:
    """Committed, verified, expired, and (``gone``) deleted, as the registrar records them."""
    events = [committed(ckpt, job=job, key=f"{ckpt}-c"), verified(ckpt, job=job, key=f"{ckpt}-v"),
              expired(ckpt, job=job, key=f"{ckpt}-e")]  # fmt: skip
    if gone:
        events.append(deleted(ckpt, job=job, key=f"{ckpt}-d"))
    for result in await registry.apply_many(events):
        assert not isinstance(result, Exception), result


def janitor(registry: Registry, archive: StoreArchive, hot: timedelta) -> Janitor:
    return Janitor(
        registry, InMemoryResumes(), SettableFeed(), FsStore("/"), RecordingPublisher(),
        lambda: NOW, RetentionMetrics(ServiceMetrics("retention-janitor")),
        archive=archive, hot=hot,
    )  # fmt: skip


async def test_cold_tombstones_leave_redis_for_the_archive_and_audit_still_reads_them(
    registry: Registry, archive: StoreArchive
) -> None:
    await life(registry, "c1", "job-1", gone=True)
    await life(registry, "c2", "job-1", gone=True)
    await life(registry, "c3", "job-1", gone=False)
    await life(registry, "c4", "job-2", gone=True)
    tombstones = {r.checkpoint_id: r for r in await registry.by_state(CheckpointState.DELETED)}
    before = await audit.audit(registry, archive)

    assert await janitor(registry, archive, timedelta(days=60)).move_cold_tombstones() == []
    moved = await janitor(registry, archive, timedelta(days=30)).move_cold_tombstones()

    assert sorted(moved) == ["c1", "c2", "c4"]
    k = registry.keys
    assert await registry.get("c1") is None
    assert await registry.by_state(CheckpointState.DELETED) == []
    assert [r.checkpoint_id for r in await registry.by_job("job-1")] == ["c3"]
    assert not await registry.r.exists(k.uri("file:///data/job-2/step-100")), "emptied: gone"
    assert not any(key.endswith((":c1", ":c2", ":c4")) for key in await registry.dump())
    assert await registry.jobs() == ["job-1", "job-2"], "the jobs stay known (R5)"

    # Audit reads the archive: the same answer as before the move.
    after = await audit.audit(registry, archive)
    assert sorted(r.checkpoint_id for r in after.records) == ["c1", "c2", "c3", "c4"]
    assert sorted(after.records, key=lambda r: r.checkpoint_id) == sorted(
        before.records, key=lambda r: r.checkpoint_id
    )
    one = await audit.audit(registry, archive, checkpoint_id="c4")
    assert one.records == [tombstones["c4"]]
    assert one.records[0].tombstone is not None
    assert (one.records[0].tombstone.actor, one.records[0].tombstone.reason) == ("janitor", "age")
    job = await audit.audit(registry, archive, job_id="job-1")
    assert sorted(r.checkpoint_id for r in job.records) == ["c1", "c2", "c3"]


async def test_a_tombstone_changed_after_it_was_read_is_not_removed(
    registry: Registry, archive: StoreArchive
) -> None:
    await life(registry, "c1", "job-1", gone=True)
    [read] = await registry.by_state(CheckpointState.DELETED)
    await archive.put([read])
    stale = read.model_copy(update={"updated_at": NOW})
    assert await registry.forget_tombstones([stale]) == [], "not the record in Redis"
    assert await registry.get("c1") == read
    assert await registry.forget_tombstones([read]) == ["c1"], "exactly the record in Redis"
    assert await registry.forget_tombstones([read]) == [], "once"
    assert await archive.get("c1") == read


async def test_tombstones_are_read_a_page_at_a_time_and_all_of_them_move(
    registry: Registry, archive: StoreArchive
) -> None:
    for i in range(7):
        await life(registry, f"c{i}", f"job-{i % 2}", gone=True)
    pages = [p async for p in registry.by_state_pages(CheckpointState.DELETED, 2)]
    assert sorted(r.checkpoint_id for p in pages for r in p) == [f"c{i}" for i in range(7)]
    moved = await janitor(registry, archive, timedelta(days=30)).move_cold_tombstones()
    assert sorted(moved) == [f"c{i}" for i in range(7)]
    assert [p async for p in registry.by_state_pages(CheckpointState.DELETED)] == []
    assert len(await archive.everything()) == 7
