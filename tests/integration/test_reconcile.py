"""Nothing stuck, against the real nats-server, Redis and a filesystem storage root: a storage
outage longer than the retry budget dead-letters the checker's delivery of a commit, and once
storage is back the checker's reconciler verifies it again and the checkpoint becomes valid;
the writer-watcher re-drives a write the registry still holds as writing."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointState,
    CheckpointWritingV1,
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
from ckpt_ha.writer_watcher.app import build as build_watcher
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings
from tests.support.bus_tools import stream_messages, wait_for

pytestmark = pytest.mark.integration

S = CheckpointState


@dataclass
class Stack:
    settings: dict[str, Any]
    root: Path
    store: FsStore
    registrar: Registrar
    checker: IntegrityChecker

    async def state(self, ckpt: str) -> S | None:
        record = await self.registrar.registry.get(ckpt)
        return record.state if record is not None else None

    async def wait(self, ckpt: str, want: S, timeout: float = 20) -> CheckpointRecord:
        async def probe() -> CheckpointRecord | None:
            record = await self.registrar.registry.get(ckpt)
            return record if record is not None and record.state is want else None

        return await wait_for(probe, timeout=timeout, what=f"{ckpt} → {want.value}")

    def metric(self, name: str, **labels: str) -> float:
        value = self.checker.metrics.registry.get_sample_value(
            name, {"service": "integrity-checker", **labels}
        )
        return value or 0.0


@pytest.fixture
async def stack(settings: ServiceSettings, tmp_path: Path) -> AsyncIterator[Stack]:
    """Registrar and checker as processes run them (their apps started: consumers and the
    background reconciler), with a retry budget of two deliveries and a verify deadline of 1 s
    so that an outage of seconds outlasts both."""
    root = tmp_path / "storage"
    root.mkdir()
    s = {**settings.model_dump(), "storage_root": str(root), "scrub_interval_s": 0,
         "max_deliver": 2, "backoff_s": (0.2,), "verify_deadline_s": 1.0,
         "reconcile_interval_s": 0.3}  # fmt: skip
    registrar = build_registrar(RegistrarSettings.model_validate(s))
    checker = build_checker(IntegrityCheckerSettings.model_validate(s))
    started = []
    try:
        for svc in (registrar, checker):
            assert svc.app is not None
            await svc.app.start()
            started.append(svc)
        yield Stack(s, root, FsStore(root), registrar, checker)
    finally:
        for svc in reversed(started):
            assert svc.app is not None
            await svc.app.stop()
            await svc.registry.close()


def write(store: FsStore, folder: str, step: int) -> str:
    shards = {"rank-0.bin": os.urandom(4096), "rank-1.bin": os.urandom(1024)}
    native.write(store, folder, shards, step=step, created_at=datetime.now(UTC))
    return checkpoint_id_on(store, folder)


async def dead_letters(settings: ServiceSettings) -> list[dict[str, str]]:
    msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
    return [dict(m.headers or {}) for m in msgs]


async def test_a_verdict_lost_to_a_storage_outage_is_re_driven_once_storage_is_back(
    stack: Stack, settings: ServiceSettings, producer: Bus
) -> None:
    cid = write(stack.store, "job-o/step-1", 1)
    commit = CheckpointCommittedV1(
        job_id="job-o", checkpoint_id=cid, uri=stack.store.uri("job-o/step-1"), run_id="r",
        step=1, format=CheckpointFormat.NATIVE,
    )  # fmt: skip
    away = stack.root.with_name("storage.outage")
    stack.root.rename(away)  # storage unmounted: every read is StorageUnavailable
    try:
        await producer.publish(build(commit, source="sdk", time=datetime.now(UTC), key="sdk"))
        await stack.wait(cid, S.PENDING_VERIFICATION)

        async def checker_gave_up() -> list[dict[str, str]]:
            return [
                d
                for d in await dead_letters(settings)
                if d.get("Ckpt-Consumer") == "integrity-checker--committed"
            ]

        [letter] = await wait_for(checker_gave_up, timeout=20, what="the commit dead-lettered")
        assert letter["Ckpt-Error-Code"] == "max_deliver"
        assert "StorageUnavailable" in letter["Ckpt-Error"]

        async def stuck_seen() -> bool:  # rounds run, find it overdue, and cannot verify
            interrupted = stack.metric("ckpt_ha_reconcile_interrupted_total")
            return interrupted >= 1 and await stack.state(cid) is S.PENDING_VERIFICATION

        await wait_for(stuck_seen, what="a reconcile round cut short by the outage")
    finally:
        away.rename(stack.root)  # storage is back
    record = await stack.wait(cid, S.VALID)
    assert [h.state for h in record.history] == [S.PENDING_VERIFICATION, S.VALID]
    assert stack.metric("ckpt_ha_redriven_checkpoints_total", state="pending_verification") >= 1

    async def settled() -> bool:
        return stack.metric("ckpt_ha_stuck_checkpoints", state="pending_verification") == 0

    await wait_for(settled, what="the next round finding nothing stuck")
    # One verdict in the stream however many rounds ran, and no new dead letter.
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    assert sum(b"checkpoint.verified" in m.data for m in msgs) == 1
    assert len(await dead_letters(settings)) == 1


async def test_a_write_whose_writer_died_unseen_ends_as_write_failed(
    stack: Stack, settings: ServiceSettings, producer: Bus
) -> None:
    """The SDK announced a write and its process died before the watcher ever saw a file: the
    watcher fails it once the writing deadline passed."""
    s = {**stack.settings, "poll_interval_s": 0.2, "stall_timeout_s": 0.5,
         "writing_deadline_s": 1.0, "reconcile_interval_s": 0.3}  # fmt: skip
    watcher = build_watcher(WriterWatcherSettings.model_validate(s))
    writing = CheckpointWritingV1(
        job_id="job-w", checkpoint_id="job-w-lost", uri=stack.store.uri("job-w/step-9"),
        run_id="r", format=CheckpointFormat.NATIVE,
    )  # fmt: skip
    await producer.publish(build(writing, source="sdk", time=datetime.now(UTC), key="sdk"))
    await stack.wait("job-w-lost", S.WRITING)
    assert watcher.app is not None
    await watcher.app.start()
    try:
        record = await stack.wait("job-w-lost", S.WRITE_FAILED)
    finally:
        await watcher.app.stop()
        await watcher.registry.close()
    assert record.history[-1].reason is not None
    assert record.history[-1].reason.startswith("write never completed")
    value = watcher.metrics.registry.get_sample_value(
        "ckpt_ha_redriven_checkpoints_total", {"service": "writer-watcher", "state": "writing"}
    )
    assert value == 1.0
