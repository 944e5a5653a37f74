"""Physical quarantine on the filesystem: layout, order of moves, idempotency, restore."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import CheckpointQuarantinedV1, FailureSide
from ckpt_ha.core.corruption import condemn
from ckpt_ha.core.locations import plan_removal
from ckpt_ha.formats import dcp, hf_trainer, native, safetensors, sidecar
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.storage import (
    FsStore,
    InvalidKey,
    ObjectInfo,
    StorageError,
    StorageUnavailable,
)
from ckpt_ha.storage.owned import remove
from ckpt_ha.storage.quarantine import (
    MARKER_NAMES,
    MARKER_SUFFIXES,
    is_commit_marker,
    quarantine,
    quarantine_key,
    restore,
)
from ckpt_ha.storage.quarantine_move import isolate
from tests.support.events import committed
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.store_contract import keys_of

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class RecordingStore(FsStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.moves: list[str] = []

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        self.moves.append(src_key.rsplit("/", 1)[-1])
        return super().move(src_key, dst_key)


def files_in(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_the_markers_are_the_formats_commit_markers() -> None:
    assert {native.MANIFEST, sidecar.COMMIT, hf_trainer.STATE, dcp.METADATA} <= MARKER_NAMES
    assert safetensors.INDEX_SUFFIX in MARKER_SUFFIXES
    assert is_commit_marker("model.safetensors.index.json")
    assert not is_commit_marker("sub/trainer_state.json")


def test_quarantine_moves_the_folder_markers_first_and_oldest_last(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    native.write(store, "job-1/step-5", {"a.bin": b"a" * 10, "b.bin": b"b" * 20}, step=5,
                 created_at=T)  # fmt: skip
    store.put("job-1/step-5/a.bin", b"a" * 10, metadata={"sha256": "ab"})  # now the newest shard
    os.utime(tmp_path / "job-1/step-5/b.bin", ns=(1, 1))  # the oldest file, named in the id
    cid = checkpoint_id_on(store, "job-1/step-5")
    store.put("job-1/step-50/other.bin", b"not ours")

    target = quarantine(store, "job-1/step-5", "job-1", cid)

    assert target == f"quarantine/job-1/{cid}"
    assert store.moves == [native.MANIFEST, "a.bin", "b.bin"]
    assert keys_of(store, "job-1/") == ["job-1/step-50/other.bin"]
    moved = ["a.bin", "b.bin", native.MANIFEST]
    assert keys_of(store, target + "/") == [f"{target}/{name}" for name in moved]
    assert store.stat(f"{target}/a.bin").metadata == {"sha256": "ab"}
    # The moved folder is still a valid checkpoint, and rename keeps the mtimes (so the id).
    assert native.verify(store, target).ok
    assert store.stat(f"{target}/b.bin").mtime == datetime.fromtimestamp(1e-9, tz=UTC)
    assert not (tmp_path / "job-1/step-5").exists()  # the emptied folder is pruned
    assert not [f for f in files_in(tmp_path) if ".ckpt-meta" in f and "quarantine" not in f]

    restore(store, target, "job-1/step-5")
    assert store.moves[3:] == ["b.bin", "a.bin", native.MANIFEST]  # oldest first, marker last
    assert checkpoint_id_on(store, "job-1/step-5") == cid
    assert keys_of(store, "quarantine/") == []


class DeletionRecordingStore(FsStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.deletes: list[str] = []
        self.ids_seen: set[str | None] = set()

    def delete(self, key: str) -> None:
        self.deletes.append(key.rsplit("/", 1)[-1])
        super().delete(key)
        if next(iter(self.list("job-1/step-5/")), None) is not None:  # half-deleted: its id
            self.ids_seen.add(checkpoint_id_on(self, "job-1/step-5"))


def test_retention_deletes_in_the_quarantine_order_so_a_half_deleted_folder_keeps_its_id(
    tmp_path: Path,
) -> None:
    """Retention's delete (`owned.remove`) goes markers first, oldest last: a writer-watcher
    listing the folder half-way sees no commit and the same id, never a new write. (Deleting
    in listing order took the index, the oldest file, second: the rest looked like a new
    checkpoint being written, and was announced as one.)"""
    store = DeletionRecordingStore(tmp_path)
    native.write(store, "job-1/step-5", {"a.bin": b"a" * 10, "b.bin": b"b" * 20}, step=5,
                 created_at=T)  # fmt: skip
    store.put("job-1/step-5/a.bin", b"a" * 10)  # now the newest shard
    os.utime(tmp_path / "job-1/step-5/b.bin", ns=(1, 1))  # the oldest file, named in the id
    cid = checkpoint_id_on(store, "job-1/step-5")
    store.put("job-1/step-50/other.bin", b"not ours")

    removed = remove(store, [plan_removal("job-1/step-5", [])])

    assert (removed.deleted, removed.kept) == (3, 0)
    assert store.deletes == [native.MANIFEST, "a.bin", "b.bin"]
    assert store.ids_seen == {cid}
    assert keys_of(store, "job-1/") == ["job-1/step-50/other.bin"]


def test_quarantine_is_idempotent_after_a_partial_move(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "job-1/step-5", {"a.bin": b"a", "b.bin": b"b"}, step=5, created_at=T)
    store.move(f"job-1/step-5/{native.MANIFEST}", f"quarantine/job-1/c1/{native.MANIFEST}")

    assert quarantine(store, "job-1/step-5", "job-1", "c1") == "quarantine/job-1/c1"
    assert quarantine(store, "job-1/step-5", "job-1", "c1") == "quarantine/job-1/c1"
    assert len(keys_of(store, "quarantine/job-1/c1/")) == 3
    assert keys_of(store, "job-1/") == []


@pytest.mark.parametrize(("job", "cid"), [("a/b", "c1"), ("job", "x/y"), ("..", "c1")])
def test_quarantine_keys_are_one_component_each(job: str, cid: str) -> None:
    with pytest.raises(InvalidKey):
        quarantine_key(job, cid)


def test_a_file_another_mover_took_is_skipped(tmp_path: Path) -> None:
    class Racing(FsStore):
        def move(self, src_key: str, dst_key: str) -> ObjectInfo:
            if src_key.endswith("a.bin"):  # the other quarantiner got there first
                super().move(src_key, dst_key)
            return super().move(src_key, dst_key)

    store = Racing(tmp_path)
    native.write(store, "job-1/step-5", {"a.bin": b"a", "b.bin": b"b"}, step=5, created_at=T)
    quarantine(store, "job-1/step-5", "job-1", "c1")
    assert len(keys_of(store, "quarantine/job-1/c1/")) == 3
    assert keys_of(store, "job-1/") == []


class FailingMoves(FsStore):
    def __init__(self, root: Path, error: StorageError) -> None:
        super().__init__(root)
        self.error = error

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        raise self.error


def condemned(store: FsStore) -> list[EventData]:
    return list(
        condemn(
            job_id="job-1", checkpoint_id="c1", uri=store.uri("job-1/step-5"), reason="r",
            side=FailureSide.JOB, why_quarantined="q",
        )
    )  # fmt: skip


async def test_isolate_moves_first_and_says_where(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "job-1/step-5", {"a.bin": b"a"}, step=5, created_at=T)
    corrupt, quarantined = await isolate(store, condemned(store), InMemoryRegistry())
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert quarantined.quarantine_uri == store.uri("quarantine/job-1/c1")
    assert corrupt == condemned(store)[0]
    assert keys_of(store, "job-1/") == []


async def test_isolate_retries_an_outage_and_quarantines_in_place_on_a_refusal(
    tmp_path: Path,
) -> None:
    outage = StorageUnavailable(reason="EIO", backend="fs")
    store = FailingMoves(tmp_path, outage)
    native.write(store, "job-1/step-5", {"a.bin": b"a"}, step=5, created_at=T)
    with pytest.raises(StorageUnavailable):
        await isolate(
            store, condemned(store), InMemoryRegistry()
        )  # the handler naks; the move resumes next time

    store.error = StorageError(reason="permission denied", backend="fs")
    _, quarantined = await isolate(store, condemned(store), InMemoryRegistry())
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert quarantined.quarantine_uri is None  # tagged all the same
    assert len(keys_of(store, "job-1/")) == 2


async def test_isolate_leaves_other_stores_and_other_events_alone(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    elsewhere = [d.model_copy(update={"uri": "s3://other/job-1/step-5"}) for d in condemned(store)]
    assert await isolate(store, elsewhere, InMemoryRegistry()) == elsewhere


async def test_isolate_never_moves_a_folder_holding_another_live_records_bytes(
    tmp_path: Path,
) -> None:
    """A checkpoint whose folder holds another live checkpoint (nested, or at the same path) is
    tagged quarantined in place: moving it would carry the other's bytes into quarantine."""
    store = FsStore(tmp_path)
    native.write(store, "job-1/step-5", {"a.bin": b"a"}, step=5, created_at=T)
    native.write(store, "job-1/step-5/inner", {"b.bin": b"b"}, step=6, created_at=T)
    registry = InMemoryRegistry()
    await registry.apply(committed("inner", job="job-1", uri=store.uri("job-1/step-5/inner")))
    before = files_in(tmp_path)
    _, quarantined = await isolate(store, condemned(store), registry)
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert quarantined.quarantine_uri is None
    assert files_in(tmp_path) == before

    registry = InMemoryRegistry()
    await registry.apply(committed("same", job="job-1", uri=store.uri("job-1/step-5")))
    _, quarantined = await isolate(store, condemned(store), registry)
    assert quarantined.quarantine_uri is None  # type: ignore[union-attr]
    assert files_in(tmp_path) == before


async def test_isolate_never_moves_a_location_its_job_does_not_own(tmp_path: Path) -> None:
    store = FsStore(tmp_path)
    native.write(store, "victim/step-5", {"a.bin": b"a"}, step=5, created_at=T)
    before = files_in(tmp_path)
    condemned_elsewhere = [
        d.model_copy(update={"uri": store.uri("victim/step-5")}) for d in condemned(store)
    ]
    _, quarantined = await isolate(store, condemned_elsewhere, InMemoryRegistry())
    assert quarantined.quarantine_uri is None  # type: ignore[union-attr]
    assert files_in(tmp_path) == before
