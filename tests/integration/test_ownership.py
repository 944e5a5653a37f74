"""Locations are owned and records belong to their job, against the real registrar, checker,
coordinator and janitor on real NATS, Redis and a filesystem store.

Each test plays a job (``evil``) that publishes what its NATS permissions let it publish (its
own job's subjects) about another job's (``victim``) checkpoints, or a retention that deletes a
record sharing bytes with a live one, and checks that nothing of the victim changed: its
records (state and history) and its bytes (every file, byte for byte).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    CheckpointVerifiedV1,
    CheckpointWriteFailedV1,
    FailureSide,
)
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV2
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native
from ckpt_ha.integrity_checker.app import IntegrityChecker
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli
from tests.support.janitor import rounds_janitor

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC).replace(microsecond=0)
S = CheckpointState


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    root = tmp_path / "storage"
    root.mkdir()
    return FsStore(root)


@pytest.fixture
def settings(settings: ServiceSettings, store: FsStore) -> ServiceSettings:
    """Every service of the test on the test's storage root."""
    return settings.model_copy(update={"storage_root": str(store.root)})


class Clock:
    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@pytest.fixture
async def janitor(
    settings: ServiceSettings, registrar: Registrar, store: FsStore
) -> AsyncIterator[tuple[Janitor, Clock]]:
    """A janitor whose rounds the test runs."""
    clock = Clock()
    async with rounds_janitor(settings, registrar.registry, store, clock) as jan:
        yield jan, clock


# --- helpers ----------------------------------------------------------------------------------


def ev(data: EventData, key: str) -> Envelope[EventData]:
    return build(data, source="test/evil", time=NOW, key=key)


def committed(job: str, ckpt: str, uri: str, step: int = 1) -> Envelope[EventData]:
    return ev(
        CheckpointCommittedV1(
            job_id=job, checkpoint_id=ckpt, uri=uri, run_id="run-1", step=step,
            format=CheckpointFormat.NATIVE,
        ),
        key=f"c-{ckpt}",
    )  # fmt: skip


def write(store: FsStore, folder: str, step: int, *, corrupt: bool = False) -> None:
    shards = {"rank-0.bin": os.urandom(4096), "rank-1.bin": os.urandom(1024)}
    native.write(store, folder, shards, step=step, created_at=NOW)
    if corrupt:
        store.put(f"{folder}/rank-1.bin", b"\x00" * 1024)


def snapshot(store: FsStore, prefix: str = "") -> dict[str, bytes]:
    """Every file under ``prefix``, byte for byte (also files a listing skips: symlinks)."""
    base = store.root / prefix
    return {
        str(p.relative_to(store.root)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


async def record(registrar: Registrar, ckpt: str) -> CheckpointRecord | None:
    return await registrar.registry.get(ckpt)


async def reach(registrar: Registrar, ckpt: str, state: S) -> CheckpointRecord:
    async def probe() -> CheckpointRecord | None:
        found = await record(registrar, ckpt)
        return found if found is not None and found.state is state else None

    found = await wait_for(probe, timeout=15, what=f"{ckpt} {state.value}")
    assert isinstance(found, CheckpointRecord)
    return found


async def make_valid(
    registrar: Registrar, producer: Bus, store: FsStore, job: str, ckpt: str, folder: str, step: int
) -> CheckpointRecord:
    """Real bytes, committed by the job, verified by the real checker."""
    write(store, folder, step)
    await producer.publish(committed(job, ckpt, store.uri(folder), step))
    return await reach(registrar, ckpt, S.VALID)


async def dead_letters(settings: ServiceSettings, **want: int) -> list[dict[str, str]]:
    """The dead letters, once each consumer named (``registrar__checkpoints=3``: the durable
    ``registrar--checkpoints``) has at least that many."""

    async def probe() -> list[dict[str, str]]:
        msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
        found = [dict(m.headers or {}) for m in msgs]
        enough = all(
            len(codes(found, consumer.replace("_", "-"))) >= n for consumer, n in want.items()
        )
        return found if enough else []

    return await wait_for(probe, timeout=20, what=f"dead letters {want}")


async def events(settings: ServiceSettings, event_type: str) -> list[dict[str, Any]]:
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    docs = [json.loads(m.data) for m in msgs]
    return [d["data"] for d in docs if d["type"].startswith(f"ckpt-ha.{event_type}.v")]


def codes(letters: list[dict[str, str]], consumer: str) -> list[str]:
    return sorted(d["Ckpt-Error-Code"] for d in letters if d["Ckpt-Consumer"] == consumer)


# --- 1. a commit at another job's location ------------------------------------------------


async def test_a_commit_at_another_jobs_location_is_refused_unread(
    registrar: Registrar,
    checker: IntegrityChecker,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
) -> None:
    """``evil`` commits the victim's valid checkpoint folder as its own, and the victim's job
    folder (the parent of its checkpoints); the victim commits its own job folder too. Each is
    refused at intake: never registered, never read by the checker, nothing moved."""
    for step in (1, 2):
        await make_valid(registrar, producer, store, "victim", f"v{step}", f"victim/s{step}", step)
    before = {c: await record(registrar, c) for c in ("v1", "v2")}
    bytes_before = snapshot(store)
    bad = [
        committed("evil", "evil-at-v1", store.uri("victim/s1")),
        committed("evil", "evil-at-parent", store.uri("victim")),
        committed("victim", "victim-at-own-folder", store.uri("victim")),
    ]
    for event in bad:
        await producer.publish(event)

    n = len(bad)
    letters = await dead_letters(settings, registrar__checkpoints=n, integrity_checker__committed=n)
    assert codes(letters, "registrar--checkpoints") == ["location_not_owned"] * len(bad)
    assert codes(letters, "integrity-checker--committed") == ["location_not_owned"] * len(bad)

    async def conflicts() -> list[dict[str, Any]]:
        found = await events(settings, "checkpoint.conflict")
        return found if len(found) >= len(bad) else []

    reported = await wait_for(conflicts, what="a conflict per refused commit")
    assert sorted(c["checkpoint_id"] for c in reported) == sorted(
        e.data.checkpoint_id  # type: ignore[attr-defined]
        for e in bad
    )
    assert all("is not the job's" in c["reason"] for c in reported)
    for event in bad:
        assert await record(registrar, event.data.checkpoint_id) is None  # type: ignore[attr-defined]
    assert await registrar.registry.by_job("evil") == []
    registered = await events(settings, "checkpoint.registered")
    assert sorted(e["checkpoint_id"] for e in registered) == ["v1", "v2"]  # the victim's own
    # Collateral: none. The victim's records and bytes are as they were; nothing quarantined.
    assert {c: await record(registrar, c) for c in ("v1", "v2")} == before
    assert snapshot(store) == bytes_before
    assert not (store.root / "quarantine").exists()


# --- 2. events of another job about a record --------------------------------------------


def about(ckpt: str, uri: str, own: str) -> list[EventData]:
    """What ``evil`` can publish about the checkpoint ``ckpt`` at ``uri`` (``own``: a location
    of evil's own folder)."""
    base: dict[str, Any] = {"job_id": "evil", "checkpoint_id": ckpt, "uri": uri}
    return [
        CheckpointVerifiedV1(**base, checks=("sizes",)),
        CheckpointCorruptV1(**base, reason="says evil", side=FailureSide.JOB),
        CheckpointQuarantinedV1(**base, reason="says evil"),
        CheckpointExpiredV1(**base, reason="says evil", policy="evil"),
        CheckpointDeletedV1(**base, reason="says evil", actor="evil"),
        CheckpointPinnedV1(**base, by="evil", reason="says evil", actor="evil"),
        CheckpointUnpinnedV1(**base, by="evil", reason="says evil", actor="evil"),
        CheckpointReleasedV1(**base, reason="says evil", actor="evil"),
        CheckpointWriteFailedV1(**base, reason="says evil"),  # at the victim's location
        CheckpointWriteFailedV1(**{**base, "uri": own}, reason="says evil"),  # at evil's own
    ]


async def test_events_of_another_job_change_no_record(
    registrar: Registrar,
    checker: IntegrityChecker,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
) -> None:
    valid = await make_valid(registrar, producer, store, "victim", "v1", "victim/s1", 1)
    await producer.publish(committed("victim", "p1", store.uri("victim/s2"), 2))  # no bytes yet
    pending = await reach(registrar, "p1", S.QUARANTINED)  # nothing there: corrupt, quarantined
    bytes_before = snapshot(store)
    own = store.uri("evil/s1")
    bad = [*about("v1", valid.uri, own), *about("p1", pending.uri, own)]
    for n, data in enumerate(bad):
        await producer.publish(ev(data, key=f"m{n}"))
    releases = sum(isinstance(d, CheckpointReleasedV1) for d in bad)
    letters = await dead_letters(
        settings, registrar__checkpoints=len(bad), integrity_checker__released=releases
    )
    # A write failure at the victim's location is refused at intake (the location is not
    # evil's), every other event by the projection (the record is not evil's).
    assert codes(letters, "registrar--checkpoints") == sorted(
        ["job_mismatch"] * (len(bad) - 2) + ["location_not_owned"] * 2
    )
    # The checker never puts bytes back into a location the releasing job does not own.
    assert codes(letters, "integrity-checker--released") == ["location_not_owned"] * releases
    assert await record(registrar, "v1") == valid
    assert await record(registrar, "p1") == pending
    assert snapshot(store) == bytes_before


# --- 3. a load failure naming another job's checkpoint -------------------------------------


async def test_a_load_failure_of_another_job_never_quarantines_the_victims_checkpoint(
    registrar: Registrar,
    checker: IntegrityChecker,
    coordinator: RestoreCoordinator,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
) -> None:
    valid = await make_valid(registrar, producer, store, "victim", "v1", "victim/s1", 1)
    bytes_before = snapshot(store)
    failure = ResumeLoadFailedV2(
        job_id="evil", plan_id="p-evil", run_id="r", checkpoint_id="v1", reason="bad bytes",
        side=FailureSide.JOB, blame=LoadBlame.CHECKPOINT,
    )  # fmt: skip
    await producer.publish(ev(failure, key="lf"))
    [letter] = await dead_letters(settings, restore_coordinator__load_failed=1)
    assert (letter["Ckpt-Consumer"], letter["Ckpt-Error-Code"]) == (
        "restore-coordinator--load-failed",
        "job_mismatch",
    )
    assert await record(registrar, "v1") == valid
    assert await events(settings, "checkpoint.quarantined") == []
    assert await coordinator.state.excluded("victim") == set()
    assert snapshot(store) == bytes_before


# --- 4. retention never deletes another live record's bytes -------------------------------


async def delete_round(jan: Janitor, ckpt: str) -> None:
    """One round: the record, expired without a grace, is deleted."""
    result = await jan.run_once(["victim"])
    assert ckpt in result.deleted, result


async def test_deleting_an_old_record_keeps_a_newer_one_at_the_same_path(
    registrar: Registrar,
    checker: IntegrityChecker,
    producer: Bus,
    store: FsStore,
    janitor: tuple[Janitor, Clock],
) -> None:
    """An old checkpoint, found corrupt and moved into quarantine, then a newer valid one
    written at the same path (a resubmitted job): deleting the old one deletes its quarantined
    bytes only, and its tombstone says what was kept and why."""
    jan, _ = janitor
    write(store, "victim/s8", 8, corrupt=True)
    await producer.publish(committed("victim", "old", store.uri("victim/s8"), 8))
    old = await reach(registrar, "old", S.QUARANTINED)
    assert old.quarantine_uri is not None
    await make_valid(registrar, producer, store, "victim", "new", "victim/s8", 8)
    expired = CheckpointExpiredV1(
        job_id="victim", checkpoint_id="old", uri=old.uri, reason="age", policy="test"
    )
    await producer.publish(build(expired, source="test/janitor", time=NOW, key="e"))
    await reach(registrar, "old", S.EXPIRED)
    kept = snapshot(store, "victim")

    await delete_round(jan, "old")
    tombstone = (await reach(registrar, "old", S.DELETED)).tombstone
    assert tombstone is not None
    assert tombstone.objects_deleted == 3  # its quarantined manifest and two shards
    assert "kept everything at victim/s8: live checkpoint new is at the same location" in (
        tombstone.reason
    )
    assert snapshot(store, "victim") == kept
    assert (await reach(registrar, "new", S.VALID)).state is S.VALID
    assert not (store.root / "quarantine" / "victim" / "old").exists()


async def test_deleting_a_record_keeps_the_live_checkpoints_nested_in_its_folder(
    registrar: Registrar,
    checker: IntegrityChecker,
    producer: Bus,
    store: FsStore,
    janitor: tuple[Janitor, Clock],
) -> None:
    jan, _ = janitor
    outer = await make_valid(registrar, producer, store, "victim", "outer", "victim/run", 1)
    await make_valid(registrar, producer, store, "victim", "inner", "victim/run/s2", 2)
    await make_valid(registrar, producer, store, "victim", "deep", "victim/run/s2/s3", 3)
    expired = CheckpointExpiredV1(
        job_id="victim", checkpoint_id="outer", uri=outer.uri, reason="age", policy="test"
    )
    await producer.publish(build(expired, source="test/janitor", time=NOW, key="e"))
    await reach(registrar, "outer", S.EXPIRED)
    nested = snapshot(store, "victim/run/s2")

    await delete_round(jan, "outer")
    tombstone = (await reach(registrar, "outer", S.DELETED)).tombstone
    assert tombstone is not None
    assert tombstone.objects_deleted == 3
    assert "victim/run/s2 (checkpoint inner)" in tombstone.reason
    assert "victim/run/s2/s3 (checkpoint deep)" in tombstone.reason
    assert snapshot(store, "victim/run/s2") == nested
    assert not (store.root / "victim" / "run" / native.MANIFEST).exists()
    for ckpt in ("inner", "deep"):
        assert (await reach(registrar, ckpt, S.VALID)).state is S.VALID


# --- 5. symlinks are checked against the checkpoint folder --------------------------------


async def test_a_shard_linked_into_another_jobs_checkpoint_is_unsafe_in_the_service_too(
    registrar: Registrar,
    checker: IntegrityChecker,
    producer: Bus,
    store: FsStore,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    """``evil`` copies the victim's manifest into its own folder and links its shards to the
    victim's: every checksum matches. The checker (reading through the storage root) says
    unsafe, as ``ckpt-ha verify`` does, and the quarantine that follows moves none of the
    victim's bytes."""
    await make_valid(registrar, producer, store, "victim", "v1", "victim/s1", 1)
    victim_bytes = snapshot(store, "victim")
    store.put(f"evil/s1/{native.MANIFEST}", store.read_bytes(f"victim/s1/{native.MANIFEST}"))
    for shard in ("rank-0.bin", "rank-1.bin"):
        (store.root / "evil" / "s1" / shard).symlink_to(store.root / "victim" / "s1" / shard)
    code, out, _ = await cli(settings, tmp_path / "home", "verify", str(store.root / "evil/s1"))
    assert code != 0
    assert out.startswith("UNSAFE")

    await producer.publish(committed("evil", "e1", store.uri("evil/s1")))
    quarantined = await reach(registrar, "e1", S.QUARANTINED)
    assert "unsafe" in (quarantined.history[1].reason or "")
    assert await registrar.registry.latest_valid("evil") is None
    assert snapshot(store, "victim") == victim_bytes
    assert (await reach(registrar, "v1", S.VALID)).state is S.VALID
