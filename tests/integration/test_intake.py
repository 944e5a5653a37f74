"""Intake across the real broker: committed → integrity-checker → verified or corrupt → registry."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat, CheckpointState
from ckpt_ha.formats import native
from ckpt_ha.integrity_checker.app import IntegrityChecker
from ckpt_ha.integrity_checker.app import build as build_checker
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from tests.support.bus_tools import job_key, stream_messages, wait_for

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
async def stack(
    settings: ServiceSettings, tmp_path: Path
) -> AsyncIterator[tuple[Registrar, IntegrityChecker, Bus, FsStore]]:
    root = tmp_path / "storage"
    root.mkdir()
    s = {**settings.model_dump(), "storage_root": str(root)}
    registrar = build_registrar(RegistrarSettings.model_validate(s))
    checker = build_checker(IntegrityCheckerSettings.model_validate(s))
    producer = Bus(settings.bus(), "test-watcher")
    for bus in (registrar.bus, checker.bus, producer):
        await bus.broker.start()
    yield registrar, checker, producer, FsStore(root)
    for bus in (producer, checker.bus, registrar.bus):
        await bus.broker.stop()
    await registrar.registry.close()
    await checker.registry.close()


def committed(store: FsStore, prefix: str, ckpt: str, step: int) -> CheckpointCommittedV1:
    return CheckpointCommittedV1(
        job_id="job-i",
        checkpoint_id=ckpt,
        uri=store.uri(prefix),
        run_id="run-1",
        step=step,
        format=CheckpointFormat.NATIVE,
    )


async def test_good_checkpoint_becomes_valid_and_bad_one_quarantined(
    stack: tuple[Registrar, IntegrityChecker, Bus, FsStore], settings: ServiceSettings
) -> None:
    registrar, _, producer, store = stack
    shards = {"rank-0.bin": os.urandom(200_000), "rank-1.bin": os.urandom(1000)}
    native.write(store, "job-i/step-10", shards, step=10, created_at=NOW)
    native.write(store, "job-i/step-20", shards, step=20, created_at=NOW)
    store.put("job-i/step-20/rank-1.bin", b"\x00" * 1000)  # same size, wrong bytes

    for ckpt, prefix, step in (("good", "job-i/step-10", 10), ("bad", "job-i/step-20", 20)):
        data = committed(store, prefix, ckpt, step)
        await producer.publish(build(data, source="test", time=NOW, key=ckpt))

    async def state(ckpt: str, want: CheckpointState) -> bool:
        rec = await registrar.registry.get(ckpt)
        return rec is not None and rec.state is want

    await wait_for(lambda: state("good", CheckpointState.VALID), what="good → valid")
    await wait_for(lambda: state("bad", CheckpointState.QUARANTINED), what="bad → quarantined")
    bad = await registrar.registry.get("bad")
    assert bad is not None
    assert [h.state for h in bad.history] == [
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.CORRUPT,
        CheckpointState.QUARANTINED,
    ]
    assert "rank-1.bin: checksum" in (bad.history[1].reason or "")
    # Its bytes were moved aside before it was announced quarantined; the good one stays.
    assert [i.key for i in store.list("quarantine/")] == [
        f"quarantine/job-i/bad/{name}" for name in (native.MANIFEST, "rank-0.bin", "rank-1.bin")
    ]
    assert not store.exists("job-i/step-20/rank-0.bin")
    assert store.exists("job-i/step-10/rank-0.bin")
    assert [r.checkpoint_id for r in await registrar.registry.by_job("job-i")] == ["bad", "good"]
    assert (await registrar.registry.latest_valid("job-i")).checkpoint_id == "good"  # type: ignore[union-attr]

    msgs = [m.data for m in await stream_messages(settings.nats_url, settings.events_stream)]
    assert any(b"checkpoint.registered" in m and b'"good"' in m for m in msgs)
    assert any(b"checkpoint.verified" in m and b"xxh3_64:" in m for m in msgs)


async def test_checkpoint_outside_the_storage_root_is_dead_lettered(
    stack: tuple[Registrar, IntegrityChecker, Bus, FsStore], settings: ServiceSettings
) -> None:
    _, _, producer, _ = stack
    data = CheckpointCommittedV1(
        job_id="job-i", checkpoint_id="elsewhere", uri="s3://other-bucket/x", run_id="r",
        step=1, format=CheckpointFormat.NATIVE,
    )  # fmt: skip
    await producer.publish(build(data, source="test", time=NOW, key="x"))

    async def letter() -> list[dict[str, str]]:
        # The checker's own (the registrar refuses the commit too, as not its job's location).
        msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
        letters = [dict(m.headers or {}) for m in msgs]
        return [h for h in letters if h["Ckpt-Consumer"] == "integrity-checker--committed"]

    [dead] = await wait_for(letter, what="dead letter")
    assert dead["Ckpt-Error-Code"] == "outside_storage_root"


async def test_watcher_finds_a_checkpoint_written_without_any_event(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    """The bus was down while the job wrote: the watcher alone gets it registered."""
    from ckpt_ha.writer_watcher.app import build as build_watcher
    from ckpt_ha.writer_watcher.settings import WriterWatcherSettings

    root = tmp_path / "storage"
    root.mkdir()
    s = {**settings.model_dump(), "storage_root": str(root), "poll_interval_s": 0.2}
    registrar = build_registrar(RegistrarSettings.model_validate(s))
    checker = build_checker(IntegrityCheckerSettings.model_validate(s))
    watcher = build_watcher(WriterWatcherSettings.model_validate(s))
    store = FsStore(root)
    store.put("job-w/step-00000040/rank-0.bin", b"a" * 4096)  # shards first, no manifest yet
    started = []
    try:
        for svc in (registrar, checker, watcher):
            assert svc.app is not None
            await svc.app.start()
            started.append(svc)

        async def state_of_job() -> list[str]:
            return [r.state.value for r in await registrar.registry.by_job("job-w")]

        assert await wait_for(state_of_job, what="writing") == ["writing"]
        native.write(store, "job-w/step-00000040", {"rank-1.bin": b"b" * 4096}, step=40,
                     created_at=NOW)  # fmt: skip

        async def valid() -> bool:
            return await state_of_job() == ["valid"]

        await wait_for(valid, timeout=20, what="the watched checkpoint to become valid")
        [record] = await registrar.registry.by_job("job-w")
        assert record.step == 40
        assert [h.state.value for h in record.history] == [
            "writing", "pending_verification", "valid",
        ]  # fmt: skip
    finally:
        for svc in reversed(started):
            assert svc.app is not None
            await svc.app.stop()
        for registry in (registrar.registry, checker.registry, watcher.registry):
            await registry.close()


async def test_sdk_save_is_announced_verified_and_registered(
    stack: tuple[Registrar, IntegrityChecker, Bus, FsStore], settings: ServiceSettings
) -> None:
    import asyncio

    import numpy as np

    from ckpt_ha import sdk

    registrar, _, _, store = stack
    weights = np.arange(1000, dtype=np.float32).reshape(10, 100)
    root = store.uri("x").removeprefix("file://")[:-2]
    saved = await asyncio.to_thread(
        sdk.save, root, "job-s", 7, {"weights": weights, "optimizer.bin": b"adam" * 100},
        run_id="run-9", code_version="abc123",
        bus=sdk.BusEndpoint(
            settings.nats_url, prefix=settings.subject_prefix, job_key=job_key("job-s")
        ),
    )  # fmt: skip
    assert saved.announced

    async def valid() -> bool:
        rec = await registrar.registry.get(saved.checkpoint_id)
        return rec is not None and rec.state is CheckpointState.VALID

    await wait_for(valid, what="the SDK's checkpoint to be valid")
    record = await registrar.registry.get(saved.checkpoint_id)
    assert record is not None
    assert record.identity is not None
    assert (record.identity.run_id, record.identity.code_version) == ("run-9", "abc123")
    assert [h.state.value for h in record.history] == ["writing", "pending_verification", "valid"]
    assert np.array_equal(sdk.load(record.uri).state["weights"], weights)


def test_sdk_save_survives_a_broker_that_is_down(tmp_path: Path) -> None:
    import socket

    import numpy as np

    from ckpt_ha import sdk
    from ckpt_ha.formats import verify_path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    saved = sdk.save(
        str(tmp_path), "job-d", 1, {"w": np.zeros(4)}, run_id="r",
        bus=sdk.BusEndpoint(f"nats://127.0.0.1:{closed}", timeout_s=1),
    )  # fmt: skip
    assert not saved.announced
    assert not saved.announced_writing
    assert verify_path(tmp_path / "job-d" / "step-00000001").ok
    with pytest.raises(ValueError, match="one path component"):
        sdk.save(str(tmp_path), "../escape", 1, {"w": b"x"}, run_id="r")
