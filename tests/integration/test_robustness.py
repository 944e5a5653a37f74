"""Watcher and checker robustness against the real broker and Redis: restarts, duplicates,
scrubbing, lost shards and physical quarantine."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointState,
)
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.integrity_checker.app import IntegrityChecker
from ckpt_ha.integrity_checker.app import build as build_checker
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from ckpt_ha.writer_watcher.app import WriterWatcher
from ckpt_ha.writer_watcher.app import build as build_watcher
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
S = CheckpointState


@dataclass
class Stack:
    settings: dict[str, Any]
    store: FsStore
    root: Path
    registrar: Registrar
    checker: IntegrityChecker
    started: list[Any]

    async def start(self, svc: Any) -> None:
        assert svc.app is not None
        await svc.app.start()
        self.started.append(svc)

    async def stop(self, svc: Any) -> None:
        self.started.remove(svc)
        await svc.app.stop()
        await svc.registry.close()

    def watcher(self) -> WriterWatcher:
        return build_watcher(WriterWatcherSettings.model_validate(self.settings))

    async def record(self, ckpt: str) -> CheckpointRecord | None:
        return await self.registrar.registry.get(ckpt)

    async def wait_state(self, ckpt: str, want: S, timeout: float = 15) -> CheckpointRecord:
        async def probe() -> CheckpointRecord | None:
            rec = await self.record(ckpt)
            return rec if rec is not None and rec.state is want else None

        return await wait_for(probe, timeout=timeout, what=f"{ckpt} → {want.value}")


@pytest.fixture
async def stack(settings: ServiceSettings, tmp_path: Path) -> AsyncIterator[Stack]:
    root = tmp_path / "storage"
    root.mkdir()
    # Retries outlast ack_wait: under load a pull fetch can time out holding the committed
    # event until ack_wait, and the verified one behind it must not run out of deliveries.
    s = {**settings.model_dump(), "storage_root": str(root), "poll_interval_s": 0.2,
         "removal_grace_s": 1.0, "scrub_interval_s": 0, "max_deliver": 10,
         "backoff_s": (0.2, 0.5, 1.0)}  # fmt: skip
    registrar = build_registrar(RegistrarSettings.model_validate(s))
    checker = build_checker(IntegrityCheckerSettings.model_validate(s))
    stack = Stack(s, FsStore(root), root, registrar, checker, [])
    try:
        await stack.start(registrar)
        await stack.start(checker)
        yield stack
    finally:
        for svc in reversed(stack.started):
            await stack.stop(svc)


class Published:
    """Every message published on a subject filter, seen by a core NATS subscription: unlike
    the stream, it also sees a re-publish that JetStream would deduplicate."""

    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.bodies: list[bytes] = []

    def count(self, needle: str) -> int:
        return sum(needle.encode() in body for body in self.bodies)


@pytest.fixture
async def published(settings: ServiceSettings) -> AsyncIterator[Published]:
    seen = Published()
    nc = await nats.connect(settings.nats_url)

    async def on_msg(msg: Any) -> None:
        seen.subjects.append(msg.subject)
        seen.bodies.append(msg.data)

    await nc.subscribe(f"{settings.subject_prefix}.>", cb=on_msg)
    yield seen
    await nc.close()


def write(store: FsStore, folder: str, step: int, **kw: Any) -> str:
    shards = {"rank-0.bin": os.urandom(4096), "rank-1.bin": os.urandom(1024)}
    native.write(store, folder, shards, step=step, created_at=NOW, **kw)
    return checkpoint_id_on(store, folder)


def counter(checker: IntegrityChecker, name: str) -> float:
    value = checker.metrics.registry.get_sample_value(name, {"service": "integrity-checker"})
    return value or 0.0


async def eventually(probe: Callable[[], bool], what: str, timeout: float = 10) -> None:
    async def check() -> bool:
        return probe()

    await wait_for(check, timeout=timeout, what=what)


async def test_a_restarted_watcher_announces_nothing_twice(
    stack: Stack, published: Published
) -> None:
    first = stack.watcher()
    await stack.start(first)
    old = write(stack.store, "job-r/step-1", 1)
    await stack.wait_state(old, S.VALID)
    await eventually(lambda: published.count(f'"checkpoint_id":"{old}"') >= 1, "committed")
    committed_before = [b for b in published.bodies if b"checkpoint.committed" in b]
    await stack.stop(first)

    second = stack.watcher()  # a new process on the same root and Redis
    await stack.start(second)
    new = write(stack.store, "job-r/step-2", 2)  # positive control: new folders still count
    await stack.wait_state(new, S.VALID)
    await asyncio.sleep(0.5)  # two more scans of the old folder

    committed = [b for b in published.bodies if b"checkpoint.committed" in b]
    assert sum(old.encode() in b for b in committed) == 1
    assert sum(new.encode() in b for b in committed) == 1
    assert len(committed) == len(committed_before) + 1
    assert await second.watcher.scan_once() == 0


async def test_the_watcher_binds_the_manifest_identity_of_the_folders_job_only(
    stack: Stack,
) -> None:
    """The folder's job owns what lies in it: its own identity is bound; a manifest naming
    another job claims nothing (the checkpoint stays the folder job's, without that identity)."""
    await stack.start(stack.watcher())
    identity = CheckpointIdentity(job_id="job-owner", run_id="run-3", project="vision")
    cid = write(stack.store, "job-owner/step-4", 4, identity=identity)
    record = await stack.wait_state(cid, S.VALID)
    assert record.identity == identity
    assert record.run_id == "run-3"
    claimed = write(stack.store, "job-folder/step-4", 4, identity=identity)
    record = await stack.wait_state(claimed, S.VALID)
    assert (record.job_id, record.identity) == ("job-folder", None)
    assert [r.checkpoint_id for r in await stack.registrar.registry.by_job("job-owner")] == [cid]


async def test_a_late_duplicate_committed_is_not_verified_again(
    stack: Stack, settings: ServiceSettings
) -> None:
    producer = Bus(settings.bus(), "test-writer")
    await producer.broker.start()
    try:
        cid = write(stack.store, "job-d/step-1", 1)
        data = CheckpointCommittedV1(
            job_id="job-d", checkpoint_id=cid, uri=stack.store.uri("job-d/step-1"), run_id="r",
            step=1, format=CheckpointFormat.NATIVE,
        )  # fmt: skip
        await producer.publish(build(data, source="sdk", time=NOW, key="sdk"))
        await stack.wait_state(cid, S.VALID)
        await producer.publish(build(data, source="watcher", time=NOW, key="late-watcher"))
        control = write(stack.store, "job-d/step-2", 2)  # consumed after the duplicate
        later = data.model_copy(update={"checkpoint_id": control, "step": 2,
                                        "uri": stack.store.uri("job-d/step-2")})  # fmt: skip
        await producer.publish(build(later, source="sdk", time=NOW, key="sdk"))
        await stack.wait_state(control, S.VALID)
    finally:
        await producer.broker.stop()

    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    verified = [m for m in msgs if m.subject.split(".")[2:4] == ["checkpoint", "verified"]]
    assert sum(cid.encode() in m.data for m in verified) == 1
    assert sum(control.encode() in m.data for m in verified) == 1
    assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []


async def test_scrub_quarantines_a_valid_checkpoint_whose_bytes_changed(
    stack: Stack, settings: ServiceSettings, published: Published
) -> None:
    await stack.start(stack.watcher())
    cid = write(stack.store, "job-s/step-7", 7)
    intact = write(stack.store, "job-s/step-8", 8)
    record = await stack.wait_state(cid, S.VALID)
    await stack.wait_state(intact, S.VALID)
    assert set(record.checksums) == {"rank-0.bin", "rank-1.bin"}

    shard = stack.root / "job-s/step-7/rank-0.bin"
    before = shard.stat()
    with shard.open("r+b") as rotting:  # bit rot in place: the file never shrinks, the
        rotting.seek(100)  # watcher (running) never sees a shard shorter than committed
        byte = rotting.read(1)
        rotting.seek(100)
        rotting.write(bytes([byte[0] ^ 0xFF]))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... and nobody wrote it

    first = await stack.checker.scrubber.scrub_once()
    assert (first.scrubbed, first.corrupt, first.complete) == (2, 1, True)
    record = await stack.wait_state(cid, S.QUARANTINED)
    assert [h.state for h in record.history][-2:] == [S.CORRUPT, S.QUARANTINED]
    reason = record.history[-2].reason or ""
    expected = record.checksums["rank-0.bin"]
    assert reason.startswith(f"scrub: rank-0.bin: checksum changed (expected {expected}, found ")
    assert (await stack.wait_state(intact, S.VALID)).state is S.VALID

    # The bytes were moved aside before `quarantined` said where they are.
    target = f"quarantine/job-s/{cid}"
    assert sorted(i.key for i in stack.store.list(target + "/")) == [
        f"{target}/{native.MANIFEST}", f"{target}/rank-0.bin", f"{target}/rank-1.bin",
    ]  # fmt: skip
    assert not (stack.root / "job-s/step-7").exists()
    uri = stack.store.uri(target).encode()
    assert any(b"checkpoint.quarantined" in b and uri in b for b in published.bodies)
    assert counter(stack.checker, "ckpt_ha_scrubbed_checkpoints_total") == 2
    assert counter(stack.checker, "ckpt_ha_scrub_corrupt_total") == 1

    # The watcher saw the folder vanish: nothing illegal, nothing dead-lettered.
    second = await stack.checker.scrubber.scrub_once()
    assert (second.scrubbed, second.corrupt) == (1, 0)
    await asyncio.sleep(0.5)
    assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []
    assert not any(b"checkpoint.write_failed" in b for b in published.bodies)


async def test_a_scrub_reports_corruption_in_the_checkpoints_stored_trace(
    stack: Stack, settings: ServiceSettings
) -> None:
    """The registry keeps the trace context of a checkpoint's first event; a scrub (a fresh
    round, possibly in a restarted checker) publishes its `corrupt` in that same trace."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    producer = Bus(settings.bus(), "test-writer")
    await producer.broker.start()
    try:
        cid = write(stack.store, "job-t/step-1", 1)
        data = CheckpointCommittedV1(
            job_id="job-t", checkpoint_id=cid, uri=stack.store.uri("job-t/step-1"), run_id="r",
            step=1, format=CheckpointFormat.NATIVE,
        )  # fmt: skip
        await producer.publish(
            build(data, source="sdk", time=NOW, key="sdk", traceparent=traceparent)
        )
        record = await stack.wait_state(cid, S.VALID)
    finally:
        await producer.broker.stop()
    assert record.traceparent == traceparent

    shard = stack.root / "job-t/step-1/rank-0.bin"
    flipped = bytearray(shard.read_bytes())
    flipped[10] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    assert (await stack.checker.scrubber.scrub_once()).corrupt == 1
    await stack.wait_state(cid, S.QUARANTINED)

    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    about = [m for m in msgs if cid.encode() in m.data]
    kinds = [m.subject.split(".")[2:4] for m in about]
    assert ["checkpoint", "verified"] in kinds
    assert ["checkpoint", "corrupt"] in kinds
    for msg in about:  # committed, verified, registered, corrupt, quarantined: one trace
        envelope = json.loads(msg.data)
        assert envelope["traceparent"].split("-")[1] == trace_id, envelope["type"]
        assert (msg.headers or {})["traceparent"].split("-")[1] == trace_id, envelope["type"]


async def test_a_storage_outage_during_scrub_is_not_corruption(
    stack: Stack, settings: ServiceSettings
) -> None:
    producer = Bus(settings.bus(), "test-writer")
    await producer.broker.start()
    try:
        cid = write(stack.store, "job-o/step-1", 1)
        data = CheckpointCommittedV1(
            job_id="job-o", checkpoint_id=cid, uri=stack.store.uri("job-o/step-1"), run_id="r",
            step=1, format=CheckpointFormat.NATIVE,
        )  # fmt: skip
        await producer.publish(build(data, source="sdk", time=NOW, key="sdk"))
        await stack.wait_state(cid, S.VALID)
    finally:
        await producer.broker.stop()

    unmounted = stack.root.with_name("unmounted")
    stack.root.rename(unmounted)  # the volume went away
    try:
        outage = await stack.checker.scrubber.scrub_once()
    finally:
        unmounted.rename(stack.root)
    assert (outage.corrupt, outage.complete) == (0, False)
    assert counter(stack.checker, "ckpt_ha_scrub_interrupted_total") == 1
    assert (await stack.record(cid)).state is S.VALID  # type: ignore[union-attr]
    back = await stack.checker.scrubber.scrub_once()
    assert (back.scrubbed, back.corrupt, back.complete) == (1, 0, True)


async def test_the_scrub_runs_on_its_own_every_interval(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    s = {**settings.model_dump(), "storage_root": str(root), "scrub_interval_s": 0.3}
    checker = build_checker(IntegrityCheckerSettings.model_validate(s))
    assert checker.app is not None
    await checker.app.start()
    try:
        await eventually(
            lambda: counter(checker, "ckpt_ha_scrub_last_round_timestamp_seconds") > 0,
            "a scrub round",
        )
    finally:
        await checker.app.stop()
        await checker.registry.close()


async def test_lost_shards_of_a_valid_checkpoint_quarantine_it(
    stack: Stack, settings: ServiceSettings, published: Published
) -> None:
    await stack.start(stack.watcher())
    cid = write(stack.store, "job-l/step-3", 3)
    await stack.wait_state(cid, S.VALID)

    stack.store.delete("job-l/step-3/rank-1.bin")  # the platform lost a shard

    record = await stack.wait_state(cid, S.QUARANTINED)
    corrupt = record.history[-2]
    assert corrupt.state is S.CORRUPT
    assert corrupt.actor == "ckpt-ha/writer-watcher"
    assert (corrupt.reason or "").startswith("files missing after verification: ['rank-1.bin")
    target = f"quarantine/job-l/{cid}"
    assert sorted(i.key.rsplit("/", 1)[1] for i in stack.store.list(target + "/")) == [
        native.MANIFEST, "rank-0.bin",
    ]  # fmt: skip
    await asyncio.sleep(0.5)
    assert not any(b"checkpoint.write_failed" in b for b in published.bodies)
    assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []


async def publish_committed(settings: ServiceSettings, stack: Stack, folder: str, cid: str) -> None:
    producer = Bus(settings.bus(), "test-writer")
    await producer.broker.start()
    try:
        data = CheckpointCommittedV1(
            job_id=folder.split("/")[0], checkpoint_id=cid, uri=stack.store.uri(folder),
            run_id="r", step=1, format=CheckpointFormat.NATIVE,
        )  # fmt: skip
        await producer.publish(build(data, source="sdk", time=NOW, key="sdk"))
    finally:
        await producer.broker.stop()


async def test_a_hand_quarantined_checkpoint_released_is_verified_again(
    stack: Stack, settings: ServiceSettings, tmp_path: Path
) -> None:
    await stack.start(stack.watcher())
    cid = write(stack.store, "job-h/step-1", 1)
    await stack.wait_state(cid, S.VALID)

    code, _, err = await cli(
        settings, tmp_path, "quarantine", cid, "--reason", "loss spike", "--actor", "alice"
    )
    assert code == 0, err
    record = await stack.wait_state(cid, S.QUARANTINED)
    assert record.quarantine_uri is None  # by hand: tagged in place, bytes untouched
    assert (stack.root / "job-h/step-1/rank-0.bin").exists()

    code, _, err = await cli(
        settings, tmp_path, "release", cid, "--reason", "spike was the data", "--actor", "bob"
    )
    assert code == 0, err
    record = await stack.wait_state(cid, S.VALID)
    assert [(h.state, h.actor) for h in record.history[-3:]] == [
        (S.QUARANTINED, "alice"),
        (S.PENDING_VERIFICATION, "bob"),
        (S.VALID, "ckpt-ha/integrity-checker"),
    ]


async def test_release_puts_repaired_bytes_back_and_bad_ones_stay_quarantined(
    stack: Stack, settings: ServiceSettings, tmp_path: Path
) -> None:
    good = write(stack.store, "job-q/step-1", 1)
    bad = write(stack.store, "job-q/step-2", 2)
    shards: dict[str, bytes] = {}
    for folder in ("job-q/step-1", "job-q/step-2"):
        path = stack.root / folder / "rank-0.bin"
        shards[folder] = path.read_bytes()
        path.write_bytes(bytes([shards[folder][0] ^ 0xFF]) + shards[folder][1:])  # bit rot
    await publish_committed(settings, stack, "job-q/step-1", good)
    await publish_committed(settings, stack, "job-q/step-2", bad)
    for cid in (good, bad):
        record = await stack.wait_state(cid, S.QUARANTINED)
        assert record.quarantine_uri == stack.store.uri(f"quarantine/job-q/{cid}")
    assert not (stack.root / "job-q/step-1").exists()

    # A human finds the cause and repairs one copy in quarantine; the other stays bad.
    (stack.root / f"quarantine/job-q/{good}/rank-0.bin").write_bytes(shards["job-q/step-1"])
    for cid in (good, bad):
        code, out, err = await cli(
            settings, tmp_path, "release", cid, "--reason", "checked", "--actor", "bob"
        )
        assert code == 0, err
        assert "quarantined -> pending_verification by bob" in out

    record = await stack.wait_state(good, S.VALID)
    assert record.quarantine_uri is None
    assert (stack.root / "job-q/step-1/rank-0.bin").read_bytes() == shards["job-q/step-1"]
    assert not (stack.root / f"quarantine/job-q/{good}").exists() or not any(
        p.is_file() for p in (stack.root / f"quarantine/job-q/{good}").rglob("*")
    )

    async def quarantined_again() -> CheckpointRecord | None:
        rec = await stack.record(bad)
        states = [h.state for h in rec.history] if rec else []
        return rec if states.count(S.QUARANTINED) == 2 else None

    record = await wait_for(quarantined_again, timeout=15, what="bad one quarantined again")
    assert [h.state for h in record.history] == [
        S.PENDING_VERIFICATION, S.CORRUPT, S.QUARANTINED,
        S.PENDING_VERIFICATION, S.CORRUPT, S.QUARANTINED,
    ]  # fmt: skip
    assert record.quarantine_uri == stack.store.uri(f"quarantine/job-q/{bad}")
    assert (stack.root / f"quarantine/job-q/{bad}/rank-0.bin").exists()
    assert not (stack.root / "job-q/step-2/rank-0.bin").exists()
