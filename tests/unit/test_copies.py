"""Copies of valid checkpoints on a replica (issue 29): the registry's projection of a copy's
changes, the copy round (streamed, verified, resumed after a cut, healed after damage) and the
restore's choice of a verified copy when the primary is condemned. Real files on tmp_path for
the primary and the replica; the registry is the in-memory fake, fed what the copier publishes
as the registrar would."""

from __future__ import annotations

import io
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCopyChangedV1,
    CheckpointCorruptV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointState,
    CopyState,
    TierChosenV1,
)
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native, verify
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.integrity_checker import copies
from ckpt_ha.integrity_checker.metrics import CopyMetrics, ScrubMetrics
from ckpt_ha.integrity_checker.replication import Replicator
from ckpt_ha.integrity_checker.scrub import Scrubber
from ckpt_ha.restore_coordinator.domain.selection import Candidate, from_copy, select
from ckpt_ha.storage import FsStore, ObjectInfo, StorageUnavailable
from ckpt_ha.storage.transfer import SourceFile, copy_folder
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
JOB = "job-a"


class RegistrarStandIn(RecordingPublisher):
    """Records what the copier published and projects it into the fake registry at once."""

    def __init__(self, registry: InMemoryRegistry) -> None:
        super().__init__()
        self.registry = registry

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        await super().publish(event)
        await self.registry.apply(event)
        return event


class CutTarget(FsStore):
    """A replica whose writes fail (an outage) after ``allowed`` objects: a copy cut short."""

    def __init__(self, root: Path, allowed: int) -> None:
        super().__init__(root)
        self.allowed = allowed
        self.keys: list[str] = []

    def put(self, key: str, data: object, *, metadata: object = None) -> ObjectInfo:
        if self.allowed <= 0:
            raise StorageUnavailable(reason="replica down (test)", backend="fs", key=key)
        self.allowed -= 1
        self.keys.append(key)
        return super().put(key, data)  # type: ignore[arg-type]


@pytest.fixture
def primary(tmp_path: Path) -> FsStore:
    (tmp_path / "primary").mkdir()
    return FsStore(tmp_path / "primary")


@pytest.fixture
def replica_dir(tmp_path: Path) -> Path:
    (tmp_path / "replica").mkdir()
    return tmp_path / "replica"


async def valid_checkpoint(
    store: FsStore, registry: InMemoryRegistry, folder: str, shards: int = 3
) -> CheckpointRecord:
    """A native checkpoint recorded valid with the checksums its verification found."""
    data = {f"rank-{i}.bin": os.urandom(200_000 + i) for i in range(shards)}
    native.write(store, folder, data, step=int(folder.rsplit("-", 1)[-1]), created_at=T0)
    report = verify(store, folder)
    assert report.ok, report
    record = CheckpointRecord(
        checkpoint_id=checkpoint_id_on(store, folder),
        job_id=folder.split("/")[0],
        step=int(folder.rsplit("-", 1)[-1]),
        uri=store.uri(folder),
        state=CheckpointState.VALID,
        checksums=report.checksums,
        total_bytes=sum(i.size for i in store.list(f"{folder}/")),
        created_at=T0,
        updated_at=T0,
    )
    registry.put(record)
    return record


async def critical(registry: InMemoryRegistry, job: str = JOB) -> None:
    chosen = TierChosenV1(job_id=job, tier="critical", reason="test", actor="tester")
    await registry.apply(build(chosen, source="test", time=T0, key="tier"))


def replicator(
    primary: FsStore, registry: InMemoryRegistry, replica: FsStore, root: str = "replica://"
) -> tuple[Replicator, RegistrarStandIn, CopyMetrics]:
    publisher = RegistrarStandIn(registry)
    metrics = CopyMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))
    rep = Replicator(
        primary, registry, publisher, lambda: T0 + timedelta(minutes=5), "xxh3_64", metrics,
        {"critical": root}, replicas={root: replica},
    )  # fmt: skip
    return rep, publisher, metrics


def copy_states(publisher: RecordingPublisher) -> list[CopyState]:
    out = []
    for event in publisher.of_type("checkpoint.copy_changed"):
        assert isinstance(event.data, CheckpointCopyChangedV1)
        out.append(event.data.copy_state)
    return out


# --- the projection ------------------------------------------------------------------------------


async def test_a_copy_change_is_recorded_beside_the_lifecycle_which_does_not_move(
    primary: FsStore,
) -> None:
    registry = InMemoryRegistry()
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    data = CheckpointCopyChangedV1(
        job_id=JOB, checkpoint_id=record.checkpoint_id, uri=record.uri,
        copy_uri="s3://copies/job-a/step-10", copy_state=CopyState.VALID, reason="verified",
    )  # fmt: skip
    applied = await registry.apply(build(data, source="test", time=T0, key="k"))
    assert applied.record is not None
    after = applied.record
    assert after.state is CheckpointState.VALID
    assert after.copies["s3://copies/job-a/step-10"].state is CopyState.VALID
    assert after.copies["s3://copies/job-a/step-10"].valid_since == T0
    assert after.history[-1].reason == "copy s3://copies/job-a/step-10: valid: verified"
    lost = data.model_copy(update={"copy_state": CopyState.MISSING, "reason": "scrub"})
    later = await registry.apply(build(lost, source="t", time=T0 + timedelta(1), key="k2"))
    assert later.record is not None
    gone = later.record.copies["s3://copies/job-a/step-10"]
    assert (gone.state, gone.valid_since) == (CopyState.MISSING, T0)  # when it was last good


async def test_a_copy_of_another_jobs_checkpoint_is_refused(primary: FsStore) -> None:
    registry = InMemoryRegistry()
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    data = CheckpointCopyChangedV1(
        job_id="job-b", checkpoint_id=record.checkpoint_id, uri=record.uri,
        copy_uri="s3://copies/x", copy_state=CopyState.VALID,
    )  # fmt: skip
    results = await registry.apply_many([build(data, source="t", time=T0, key="k")])
    assert isinstance(results[0], Exception)
    assert (await registry.get(record.checkpoint_id)).copies == {}  # type: ignore[union-attr]


# --- streaming -----------------------------------------------------------------------------------


def test_the_source_file_reads_in_pieces_and_seeks_by_reopening(primary: FsStore) -> None:
    data = os.urandom(3 * 2**20 + 7)
    primary.put("a/b.bin", data)
    f = SourceFile(primary, "a/b.bin", len(data))
    assert f.seek(0, io.SEEK_END) == len(data)
    f.seek(0)
    first = f.read(10 * 2**20)
    assert len(first) == 2**20  # one piece per read, never the whole object
    f.seek(len(data) - 7)
    assert f.read() == data[-7:]
    f.close()


def test_a_folder_copy_writes_the_commit_evidence_last_and_skips_what_is_there(
    primary: FsStore, replica_dir: Path
) -> None:
    native.write(primary, "j/step-1", {"a.bin": b"x" * 100, "z.bin": b"y" * 50}, step=1,
                 created_at=T0)  # fmt: skip
    target = CutTarget(replica_dir, allowed=100)
    done = copy_folder(primary, target, "j/step-1", last=copies.commit_evidence)
    assert target.keys[-1] == f"j/step-1/{native.MANIFEST}"
    assert (done.objects, done.written) == (3, 3)
    again = copy_folder(primary, target, "j/step-1", last=copies.commit_evidence)
    assert (again.written, again.bytes_written) == (0, 0)


# --- the copy round ------------------------------------------------------------------------------


async def test_a_valid_checkpoint_of_a_replicating_tier_is_copied_verified_and_recorded(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    replica = FsStore(replica_dir)
    rep, publisher, metrics = replicator(primary, registry, replica)
    result = await rep.copy_once()
    assert (result.copied, result.waiting, result.complete) == (1, 1, True)
    assert copy_states(publisher) == [CopyState.COPYING, CopyState.VALID]
    copy_uri = replica.uri(f"{JOB}/step-10")
    after = await registry.get(record.checkpoint_id)
    assert after is not None
    assert after.copies[copy_uri].state is CopyState.VALID
    assert verify(replica, f"{JOB}/step-10").checksums == record.checksums
    assert metrics.bytes.labels("integrity-checker")._value.get() == record.total_bytes
    # Nothing left to copy: the next round publishes nothing.
    assert (await rep.copy_once()).waiting == 0
    assert len(publisher.events) == 2


async def test_a_tier_that_does_not_replicate_gets_no_copy(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await valid_checkpoint(primary, registry, f"{JOB}/step-10")  # the default tier: no copies
    rep, publisher, _ = replicator(primary, registry, FsStore(replica_dir))
    assert (await rep.copy_once()).waiting == 0
    assert publisher.events == []
    assert list(FsStore(replica_dir).list()) == []


async def test_a_copy_cut_short_stays_copying_and_the_next_round_resumes_it(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10", shards=4)
    cut = CutTarget(replica_dir, allowed=2)
    rep, publisher, _ = replicator(primary, registry, cut)
    result = await rep.copy_once()
    assert not result.complete
    copy_uri = cut.uri(f"{JOB}/step-10")
    half = await registry.get(record.checkpoint_id)
    assert half is not None
    assert half.copies[copy_uri].state is CopyState.COPYING
    assert not cut.exists(f"{JOB}/step-10/{native.MANIFEST}")  # never looks committed
    assert copy_states(publisher) == [CopyState.COPYING]
    # The replica is back: the next round writes only what is missing, then verifies it all.
    cut.allowed = 100
    first_written = list(cut.keys)
    assert (await rep.copy_once()).copied == 1
    assert not set(first_written) & set(cut.keys[len(first_written) :])
    assert copy_states(publisher) == [CopyState.COPYING, CopyState.VALID]  # one copying only
    done = await registry.get(record.checkpoint_id)
    assert done is not None
    assert list(done.copies) == [copy_uri]
    assert done.copies[copy_uri].state is CopyState.VALID


async def test_a_copy_damaged_on_the_replica_is_copied_again_and_valid(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    replica = FsStore(replica_dir)
    rep, publisher, _ = replicator(primary, registry, replica)
    await rep.copy_once()
    shard = replica_dir / JOB / "step-10" / "rank-1.bin"
    damaged = bytearray(shard.read_bytes())
    damaged[100] ^= 0xFF  # same size: only the verification can tell
    shard.write_bytes(bytes(damaged))
    copy_uri = replica.uri(f"{JOB}/step-10")
    found = CheckpointCopyChangedV1(
        job_id=JOB, checkpoint_id=record.checkpoint_id, uri=record.uri, copy_uri=copy_uri,
        copy_state=CopyState.CORRUPT, reason="scrub: rank-1.bin: checksum changed",
    )  # fmt: skip
    await registry.apply(build(found, source="t", time=T0 + timedelta(minutes=1), key="scrub"))
    assert (await rep.copy_once()).copied == 1
    assert copy_states(publisher)[-2:] == [CopyState.COPYING, CopyState.VALID]
    assert verify(replica, f"{JOB}/step-10").checksums == record.checksums
    healed = await registry.get(record.checkpoint_id)
    assert healed is not None
    assert healed.copies[copy_uri].state is CopyState.VALID


async def test_replication_lag_is_the_age_of_the_oldest_valid_checkpoint_lacking_its_copy(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    assert copies.lag_seconds([record], T0 + timedelta(seconds=90)) == 90.0
    assert copies.lag_seconds([], T0) == 0.0
    cut = CutTarget(replica_dir, allowed=0)  # the replica is down: nothing is copied
    rep, _, metrics = replicator(primary, registry, cut)
    await rep.copy_once()
    assert metrics.lag.labels("integrity-checker", "critical")._value.get() == 300.0
    cut.allowed = 100
    await rep.copy_once()
    assert metrics.lag.labels("integrity-checker", "critical")._value.get() == 0.0
    assert metrics.rpo.labels("integrity-checker", "critical")._value.get() == 1800.0


# --- restoring from a copy -----------------------------------------------------------------------


def cand(cid: str, step: int, state: CheckpointState, copies_: tuple[str, ...] = ()) -> Candidate:
    return Candidate(cid, step, f"file:///p/{cid}", state, copies=copies_)


def test_a_condemned_primary_with_a_verified_copy_is_restored_from_the_copy() -> None:
    newest = cand("c3", 30, CheckpointState.QUARANTINED, ("s3://copies/c3",))
    older = cand("c2", 20, CheckpointState.VALID)
    chosen = select([newest, older]).chosen
    assert chosen is not None
    assert (chosen.checkpoint_id, chosen.uri) == ("c3", "s3://copies/c3")
    assert chosen.source is not None
    assert "is quarantined" in chosen.source


def test_a_condemned_primary_without_a_copy_is_skipped_for_the_older_one() -> None:
    newest = cand("c3", 30, CheckpointState.CORRUPT)
    chosen = select([newest, cand("c2", 20, CheckpointState.VALID)]).chosen
    assert chosen is not None
    assert chosen.checkpoint_id == "c2"


def test_a_missing_primary_is_restored_from_its_copy_and_the_reason_says_so() -> None:
    c = cand("c3", 30, CheckpointState.VALID, ("s3://copies/c3", "s3://other/c3"))
    moved = from_copy(c, "is missing")
    assert moved.uri == "s3://copies/c3"
    assert moved.source == (
        "primary file:///p/c3 is missing: restoring from its verified copy s3://copies/c3"
    )
    assert from_copy(cand("c1", 1, CheckpointState.VALID), "is missing").uri == "file:///p/c1"


# --- the scrub of copies -------------------------------------------------------------------------


def scrubber_with_copies(
    primary: FsStore, registry: InMemoryRegistry, rep: Replicator, publisher: RecordingPublisher
) -> Scrubber:
    metrics = ScrubMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))
    return Scrubber(primary, registry, publisher, lambda: T0 + timedelta(hours=1), "xxh3_64",
                    metrics, copies=rep)  # fmt: skip


async def test_the_scrub_finds_a_damaged_copy_and_the_copy_loop_heals_it(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    replica = FsStore(replica_dir)
    rep, publisher, _ = replicator(primary, registry, replica)
    await rep.copy_once()
    shard = replica_dir / JOB / "step-10" / "rank-2.bin"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    copied = await registry.get(record.checkpoint_id)
    assert copied is not None
    result = await scrubber_with_copies(primary, registry, rep, publisher).scrub_once()
    assert (result.scrubbed, result.corrupt) == (1, 0)  # the primary is intact
    copy_uri = replica.uri(f"{JOB}/step-10")
    found = await registry.get(record.checkpoint_id)
    assert found is not None
    assert found.copies[copy_uri].state is CopyState.CORRUPT
    assert found.state is CheckpointState.VALID
    assert (found.copies[copy_uri].reason or "").startswith("scrub: rank-2.bin: checksum changed")
    assert (await rep.copy_once()).copied == 1  # copied again from the primary
    healed = await registry.get(record.checkpoint_id)
    assert healed is not None
    assert healed.copies[copy_uri].state is CopyState.VALID
    assert verify(replica, f"{JOB}/step-10").checksums == record.checksums


async def test_a_lost_primary_with_a_good_copy_is_condemned_but_names_the_copy(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    replica = FsStore(replica_dir)
    rep, publisher, _ = replicator(primary, registry, replica)
    await rep.copy_once()
    for info in list(primary.list(f"{JOB}/step-10/")):
        primary.delete(info.key)  # the primary's storage wiped
    result = await scrubber_with_copies(primary, registry, rep, publisher).scrub_once()
    assert result.corrupt == 1
    [corrupt] = publisher.of_type("checkpoint.corrupt")
    assert isinstance(corrupt.data, CheckpointCorruptV1)
    assert corrupt.data.reason.endswith(
        f"restorable from its verified copy {replica.uri(f'{JOB}/step-10')}"
    )
    assert copy_states(publisher)[-1] is CopyState.VALID  # the copy was checked: still good


async def test_every_copy_lost_is_corrupt_with_all_copies_lost(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    replica = FsStore(replica_dir)
    rep, publisher, metrics = replicator(primary, registry, replica)
    await rep.copy_once()
    for store in (primary, replica):
        for info in list(store.list(f"{JOB}/step-10/")):
            store.delete(info.key)
    await scrubber_with_copies(primary, registry, rep, publisher).scrub_once()
    copy_uri = replica.uri(f"{JOB}/step-10")
    after = await registry.get(record.checkpoint_id)
    assert after is not None
    assert after.copies[copy_uri].state is CopyState.MISSING
    assert (after.copies[copy_uri].reason or "").startswith("all copies lost: scrub:")
    [corrupt] = publisher.of_type("checkpoint.corrupt")
    assert isinstance(corrupt.data, CheckpointCorruptV1)
    assert corrupt.data.reason.startswith("all copies lost: scrub:")
    assert metrics.all_lost.labels("integrity-checker")._value.get() == 1


# --- retention covers every copy -----------------------------------------------------------------


async def test_a_deleted_checkpoint_loses_every_copy_and_its_tombstone_names_them(
    primary: FsStore, replica_dir: Path
) -> None:
    registry = InMemoryRegistry()
    await critical(registry)
    record = await valid_checkpoint(primary, registry, f"{JOB}/step-10")
    replica = FsStore(replica_dir)
    rep, publisher, _ = replicator(primary, registry, replica)
    await rep.copy_once()
    copy_uri = replica.uri(f"{JOB}/step-10")
    expired = CheckpointExpiredV1(job_id=JOB, checkpoint_id=record.checkpoint_id, uri=record.uri,
                                  reason="age", policy="critical: keep_last=5")  # fmt: skip
    await registry.apply(build(expired, source="janitor", time=T0 + timedelta(days=1), key="e"))
    deleted = CheckpointDeletedV1(job_id=JOB, checkpoint_id=record.checkpoint_id, uri=record.uri,
                                  reason="age", actor="retention-janitor")  # fmt: skip
    event = build(deleted, source="janitor", time=T0 + timedelta(days=2), key="d")
    await registry.apply(event)
    tomb = await registry.get(record.checkpoint_id)
    assert tomb is not None
    assert tomb.tombstone is not None
    assert tomb.tombstone.copies == (copy_uri,)
    await rep.on_deleted(event)
    await rep.on_deleted(event)  # a redelivery changes nothing
    assert list(replica.list(f"{JOB}/")) == []
    after = await registry.get(record.checkpoint_id)
    assert after is not None
    assert after.copies[copy_uri].state is CopyState.DELETED
    assert copy_states(publisher)[-1] is CopyState.DELETED
    assert copy_states(publisher).count(CopyState.DELETED) == 1
    assert (await rep.copy_once()).waiting == 0  # never copied again
