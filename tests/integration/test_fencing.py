"""A zombie writer is fenced (R17), against real NATS and Redis with the real registrar,
integrity-checker and restore-coordinator in-process, and two real training processes writing
with the SDK under the runner's variables (`tests/support/fence_writer.py`).

Attempt 1 of run ``run-1`` writes a checkpoint (valid), then its runner reports it failed; the
coordinator plans attempt 2. Attempt 1 is in fact still alive (a partition): it keeps writing
checkpoints and reporting progress beside attempt 2. Its later checkpoints end ``fenced``
(``checkpoint.fenced`` published, never valid, bytes kept), attempt 2's end valid, the
checkpoint it wrote before the plan stays valid, and its progress is ignored.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.job import FailureCauseV1, JobFailedV1, JobPolicy, JobStartedV1
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.integrity_checker.app import IntegrityChecker
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol
from ckpt_ha.writer_watcher.app import build as build_watcher
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings
from tests.support.bus_tools import wait_for
from tests.support.resume_tools import events, runner_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JOB = "job-zombie"
S = CheckpointState


@pytest.fixture
def settings(settings: ServiceSettings, tmp_path: Path) -> ServiceSettings:
    """Every service and both attempts on one storage root."""
    (tmp_path / "store").mkdir()
    return settings.model_copy(update={"storage_root": str(tmp_path / "store")})


class Attempt:
    """One attempt of the job: a real process writing with the SDK (`fence_writer`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, settings: ServiceSettings, attempt: int, **extra: str) -> Attempt:
        env = {
            **os.environ,
            **runner_env(settings, Path(settings.storage_root), JOB),
            protocol.ATTEMPT: str(attempt),
            protocol.CODE_VERSION: "abc123",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            **extra,
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "tests" / "support" / "fence_writer.py"),
            cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        return cls(proc)

    async def do(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout=30)
        assert line, f"{command}: the writer exited ({self.proc.returncode})"
        answer: dict[str, Any] = json.loads(line)
        assert "error" not in answer, answer
        return answer

    async def stop(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"quit\n")
            await self.proc.stdin.drain()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def watcher_pass(settings: ServiceSettings) -> None:
    """One real writer-watcher pass over the storage root."""
    svc = build_watcher(WriterWatcherSettings.model_validate(settings.model_dump()))
    await svc.bus.broker.start()
    try:
        await svc.watcher.scan_once()
    finally:
        await svc.bus.broker.stop()
        await svc.registry.close()


def files_at(uri: str) -> list[Path]:
    return [p for p in Path(uri.removeprefix("file://")).rglob("*") if p.is_file()]


async def in_state(registrar: Registrar, checkpoint_id: str, state: S) -> CheckpointRecord | None:
    record = await registrar.registry.get(checkpoint_id)
    return record if record is not None and record.state is state else None


async def test_zombie_writer_fenced(
    settings: ServiceSettings,
    registrar: Registrar,
    checker: IntegrityChecker,
    coordinator: RestoreCoordinator,
    producer: Bus,
) -> None:
    zombie = await Attempt.start(settings, 1)
    resumed: Attempt | None = None
    try:
        early = await zombie.do("save 10")
        await zombie.do("progress 10")
        valid = await wait_for(
            lambda: in_state(registrar, early["checkpoint_id"], S.VALID),
            timeout=20,
            what="attempt 1's first checkpoint valid",
        )
        assert valid is not None
        identity = valid.identity
        assert identity is not None
        assert (identity.run_id, identity.attempt) == ("run-1", 1)

        # The runner of attempt 1 reports it started, then lost: the coordinator plans attempt 2.
        now = datetime.now(UTC)
        started = JobStartedV1(
            job_id=JOB, run_id="run-1", attempt=1, policy=JobPolicy(),
            environment=identity.environment, topology=identity.topology, code_version="abc123",
        )  # fmt: skip
        failed = JobFailedV1(
            job_id=JOB, run_id="run-1", attempt=1, cause=FailureCauseV1.NODE_EXIT, signal=9,
            signature="node_exit:1", last_step=10,
        )  # fmt: skip
        for data, key in ((started, "started-1"), (failed, "failed-1")):
            await producer.publish(build(data, source="test/runner", time=now, key=key))
        [plan] = await wait_for(
            lambda: events(settings, "resume.planned", JOB), timeout=20, what="resume.planned"
        )
        assert (plan["attempt"], plan["checkpoint_id"]) == (2, early["checkpoint_id"])
        await wait_for(
            lambda: registrar.registry.planned_attempt(JOB, "run-1"),
            what="the registrar knows the fence",
        )

        # Attempt 1 is still alive: it writes beside attempt 2.
        plan_doc = next(
            d for d in await events(settings, "resume.planned", JOB) if d["attempt"] == 2
        )
        resumed = await Attempt.start(settings, 2, **{protocol.RESUME_PLAN: json.dumps(plan_doc)})
        late = [await zombie.do("save 20")]
        await zombie.do("progress 20")
        mine = await resumed.do("save 20")
        await resumed.do("progress 11")
        late.append(await zombie.do("save 30"))
        await zombie.do("progress 30")
        assert all(s["announced"] for s in (*late, mine))

        fenced = await wait_for(
            lambda: _at_least(events(settings, "checkpoint.fenced", JOB), 2),
            timeout=20,
            what="checkpoint.fenced for both of the zombie's late checkpoints",
        )
        assert sorted(f["checkpoint_id"] for f in fenced) == sorted(
            s["checkpoint_id"] for s in late
        )
        assert {(f["run_id"], f["attempt"], f["fenced_by"]) for f in fenced} == {("run-1", 1, 2)}
        await wait_for(
            lambda: in_state(registrar, mine["checkpoint_id"], S.VALID),
            timeout=20,
            what="attempt 2's checkpoint valid",
        )

        # Give a late verdict on the zombie's checkpoints the time to arrive: it moves nothing.
        await wait_for(
            lambda: _at_least(events(settings, "checkpoint.registered", JOB), 2),
            timeout=20,
            what="registrations",
        )
        for saved in late:
            record = await registrar.registry.get(saved["checkpoint_id"])
            assert record is not None
            assert (record.state, record.fenced_by) == (S.FENCED, 2)
            assert S.VALID not in {h.state for h in record.history}
            assert record.tombstone is None
            assert await asyncio.to_thread(files_at, record.uri)  # the bytes are still there
        registered = {r["checkpoint_id"] for r in await events(settings, "checkpoint.registered")}
        assert registered == {early["checkpoint_id"], mine["checkpoint_id"]}
        assert (await registrar.registry.get(early["checkpoint_id"])).state is S.VALID  # type: ignore[union-attr]

        # The zombie's progress is ignored: attempt 1's last point is still the one before the
        # plan, and the coordinator counted the two stale reports.
        async def stale_counted() -> float:
            value = coordinator.metrics.registry.get_sample_value(
                "ckpt_ha_stale_progress_total", {"service": coordinator.metrics.service}
            )
            return value if value is not None and value >= 2 else 0.0

        assert await wait_for(stale_counted, what="two stale progress reports") == 2
        last = await coordinator.state.last(JOB, 1)
        assert last is not None
        assert last.step == 10

        # A zombie checkpoint only the writer-watcher reports (the writer's announcement was
        # lost): the native manifest's identity names attempt 1, so it is fenced all the same.
        unannounced = await asyncio.to_thread(
            sdk.save, settings.storage_root, JOB, 40, {"w": np.zeros(2)}, run_id="run-1", attempt=1
        )
        assert not unannounced.announced
        await watcher_pass(settings)
        await wait_for(
            lambda: in_state(registrar, unannounced.checkpoint_id, S.FENCED),
            timeout=20,
            what="the watcher-announced zombie checkpoint fenced",
        )
        fenced = await events(settings, "checkpoint.fenced", JOB)
        assert sorted(f["checkpoint_id"] for f in fenced) == sorted(
            [*(s["checkpoint_id"] for s in late), unannounced.checkpoint_id]
        )  # once each: the watcher's reports of the announced ones added nothing
    finally:
        await zombie.stop()
        if resumed is not None:
            await resumed.stop()


async def _at_least(probe: Any, n: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await probe
    return found if len(found) >= n else []
