"""The five services as separate processes against S3 (moto's server), the real NATS and Redis.

Each runs as `ckpt-ha serve <name>` with ``CKPT_HA_STORAGE_ROOT=s3://<bucket>/<prefix>``; they
find the S3 endpoint and credentials the way any boto3 program does (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``).

* A job saves through the SDK: a good checkpoint ends valid and registered, one whose shard the
  storage silently corrupted on write ends corrupt and quarantined; past the tier's quarantine
  retention, retention deletes it and its quarantine copy from the bucket.
* The whole loop: a job under `ckpt-ha run` saving to S3 is killed; the restore-coordinator plans
  its resume from the newest valid checkpoint, the relaunched attempt loads it from S3 and
  finishes, and the coordinator deletes the partial write the killed attempt left. Retention then
  deletes the expired checkpoints' objects from the bucket (tombstones recorded), and
  `ckpt-ha reconcile` finds nothing unknown but the objects a test put there, and deletes exactly
  those when told.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.stack import start_service
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.runner.runner import ATTEMPT_FILE, state_dir
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import ObjectInfo, S3Store, key_for_uri, open_store
from tests.support.bus_tools import job_key, stream_messages, wait_for
from tests.support.cli_tools import cli, stack_env
from tests.support.damage import flip_last_byte
from tests.support.moto_server import (
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    aws_env,
    s3_client,
    start_moto_server,
)
from tests.support.resume_tools import events
from tests.system.faults.flows import ShiftedClock, janitor_rounds

pytestmark = pytest.mark.e2e

PREFIX = "checkpoints"


@dataclass(frozen=True)
class S3Stack:
    bucket: str
    client: Any
    """The test's own S3 client, on the same bucket the services use."""
    root: str
    endpoint: str
    processes: tuple[procs.ManagedProcess, ...]

    @property
    def store(self) -> S3Store:
        return S3Store(self.bucket, PREFIX, client=self.client)


def service_env(settings: ServiceSettings, endpoint: str, root: str) -> dict[str, str]:
    return {
        **stack_env(settings),
        "CKPT_HA_STORAGE_ROOT": root,
        "CKPT_HA_POLL_INTERVAL_S": "0.3",
        "CKPT_HA_ACK_WAIT_S": "5",
        "CKPT_HA_BACKOFF_S": "[0.2, 0.5, 1]",
        "CKPT_HA_GRACEFUL_TIMEOUT_S": "5",
        **aws_env(endpoint),
    }


@pytest.fixture
def s3_stack(settings: ServiceSettings, tmp_path: Path) -> Iterator[S3Stack]:
    endpoint, stop_moto = start_moto_server()
    client = s3_client(endpoint)
    bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/{PREFIX}"
    env = service_env(settings, endpoint, root)
    started: list[procs.ManagedProcess] = []
    try:
        # Side by side: each waits for its own /healthz (the set-up takes one start, not five).
        with ThreadPoolExecutor(len(SERVICE_NAMES)) as pool:
            starts = [
                pool.submit(start_service, name, tmp_path, env, timeout=60)
                for name in SERVICE_NAMES
            ]
            for start in starts:
                with contextlib.suppress(Exception):  # raised again below, once all are known
                    started.append(start.result())
            for start in starts:
                start.result()
        yield S3Stack(bucket, client, root, endpoint, tuple(started))
    finally:
        with ThreadPoolExecutor(len(SERVICE_NAMES)) as pool:
            list(pool.map(lambda p: procs.stop(p, timeout=15), started))
        stop_moto()
    leftovers = [p.name for p in started if procs.is_alive(p)]
    assert not leftovers, f"still running after stop: {leftovers}"


async def stream_summary(settings: ServiceSettings) -> list[tuple[str, str, str, str]]:
    """(type, checkpoint, source, id) of every event on the stream: the evidence on a failure."""
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    docs = [json.loads(m.data) for m in msgs]
    return [(d["type"], d["data"].get("checkpoint_id", ""), d["source"], d["id"]) for d in docs]


class CorruptingS3Store(S3Store):
    """Storage that silently flips one byte of ``victim`` on write (same size, other bytes)."""

    def __init__(self, stack: S3Stack, victim: str) -> None:
        super().__init__(stack.bucket, PREFIX, client=stack.client)
        self.victim = victim

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        if key.endswith(self.victim):
            data = flip_last_byte(data)
        return super().put(key, data, metadata=metadata)


async def test_good_checkpoint_registered_corrupt_one_quarantined_on_s3(
    s3_stack: S3Stack, settings: ServiceSettings
) -> None:
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    weights = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    state = {"weights": weights, "optimizer": {"step": 1, "lr": 3e-4}, "rng": b"\x07" * 32}
    bus = sdk.BusEndpoint(
        settings.nats_url, prefix=settings.subject_prefix, job_key=job_key("job-s3")
    )

    async def record(checkpoint_id: str) -> CheckpointRecord | None:
        return await registry.get(checkpoint_id)

    try:
        # Good: the SDK announces writing + committed; verified on S3 by another process.
        good = await asyncio.to_thread(
            sdk.save, s3_stack.store, "job-s3", 100, state, run_id="run-1", project="e2e",
            bus=bus,
        )  # fmt: skip
        assert good.uri.startswith(f"{s3_stack.root}/job-s3/")

        async def good_valid() -> CheckpointRecord | None:
            rec = await record(good.checkpoint_id)
            return rec if rec is not None and rec.state is CheckpointState.VALID else None

        rec = await wait_for(good_valid, timeout=45, what="the S3 checkpoint to become valid")
        assert good.announced_writing
        assert [h.state for h in rec.history] == [
            CheckpointState.WRITING,
            CheckpointState.PENDING_VERIFICATION,
            CheckpointState.VALID,
        ], await stream_summary(settings)
        assert rec.identity is not None
        assert rec.identity.project == "e2e"
        assert rec.uri == good.uri

        async def registered() -> bool:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            docs = [json.loads(m.data) for m in msgs]
            return any(
                d["type"] == "ckpt-ha.checkpoint.registered.v1"
                and d["data"]["checkpoint_id"] == good.checkpoint_id
                for d in docs
            )

        assert await wait_for(registered, timeout=20, what="checkpoint.registered")

        # Corrupt: storage flips a byte of one shard; no bus, so the watcher alone finds it.
        flaky = CorruptingS3Store(s3_stack, "state/weights.npy")
        bad = await asyncio.to_thread(
            sdk.save, flaky, "job-s3", 200, state, run_id="run-1", project="e2e"
        )
        assert not bad.announced

        async def bad_quarantined() -> CheckpointRecord | None:
            rec = await record(bad.checkpoint_id)
            return rec if rec is not None and rec.state is CheckpointState.QUARANTINED else None

        rec = await wait_for(bad_quarantined, timeout=45, what="the corrupt checkpoint quarantined")
        states = [h.state for h in rec.history]
        assert states[-3:] == [
            CheckpointState.PENDING_VERIFICATION,
            CheckpointState.CORRUPT,
            CheckpointState.QUARANTINED,
        ]
        assert states[:-3] in ([], [CheckpointState.WRITING])  # did a scan catch it mid-write?
        corrupt = next(h for h in rec.history if h.state is CheckpointState.CORRUPT)
        assert "state/weights.npy: checksum" in (corrupt.reason or "")
        latest = await registry.latest_valid("job-s3")
        assert latest is not None
        assert latest.checkpoint_id == good.checkpoint_id

        # The good one loads back from S3, bit for bit; the bad one is refused on load too.
        loaded = sdk.load(s3_stack.store, "job-s3/step-00000100")
        assert loaded.state["weights"].tobytes() == weights.tobytes()
        with pytest.raises(sdk.CheckpointUnreadable):
            sdk.load(s3_stack.store, "job-s3/step-00000200")

        # Past the tier's quarantine retention (a day), retention deletes the quarantined
        # checkpoint: its location and its copy under quarantine/ are gone from the bucket.
        where = [key_for_uri(s3_stack.store, u) for u in (rec.uri, rec.quarantine_uri or "")]
        assert all(where), where
        assert any(keys_under(s3_stack, k or "") for k in where)
        async with janitor_on(s3_stack, settings) as (janitor, clock):
            clock.offset = timedelta(days=2)
            assert (await janitor.run_once(["job-s3"])).expired == [bad.checkpoint_id]

            async def expired() -> bool:
                now = await record(bad.checkpoint_id)
                return now is not None and now.state is CheckpointState.EXPIRED

            await wait_for(expired, timeout=20, what="the corrupt checkpoint expired")
            clock.offset = timedelta(days=3)
            assert (await janitor.run_once(["job-s3"])).deleted == [bad.checkpoint_id]

        async def tombstone() -> CheckpointRecord | None:
            now = await record(bad.checkpoint_id)
            return now if now is not None and now.tombstone is not None else None

        assert (await wait_for(tombstone, timeout=20, what="the tombstone")).state is S.DELETED
        assert [keys_under(s3_stack, k or "") for k in where] == [[], []]
        assert sdk.load(s3_stack.store, "job-s3/step-00000100").step == 100
        assert all(procs.is_alive(p) for p in s3_stack.processes)
    finally:
        await registry.close()


# -- the whole loop on S3 --------------------------------------------------------------------

STEPS, EVERY, STEP_S = 30, 10, 0.1
"""The example job's length, checkpoint interval and pace (1 s from step 21 to step 30's save:
time to freeze the first attempt in between)."""

S = CheckpointState


class Killed(BaseException):
    """The writing process dies: nothing after this point of its write runs, no clean-up."""


class DyingS3Store(S3Store):
    """A writer's storage that dies after its first object (a checkpoint's index): the partial
    write a process killed mid-save leaves behind."""

    def __init__(self, stack: S3Stack) -> None:
        super().__init__(stack.bucket, PREFIX, client=stack.client)
        self.writes = 0

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        self.writes += 1
        if self.writes > 1:
            raise Killed
        return super().put(key, data, metadata=metadata)


def s3_env(stack: S3Stack) -> dict[str, str]:
    """A CLI's or a training job's environment: the stack's storage root and S3 endpoint."""
    return {"CKPT_HA_STORAGE_ROOT": stack.root, **aws_env(stack.endpoint)}


@dataclass(frozen=True)
class Runner:
    """`ckpt-ha run` of the numpy example, its output in files under ``home``."""

    proc: subprocess.Popen[bytes]
    home: Path
    job: str
    run_id: str

    def child_pid(self, attempt: int) -> int | None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads(
                (state_dir(self.home, self.job, self.run_id) / ATTEMPT_FILE).read_text()
            )
            if doc["attempt"] == attempt:
                return int(doc["handle"])
        return None

    def last_step(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            return int((state_dir(self.home, self.job, self.run_id) / "progress").read_text())
        return 0

    def output(self) -> str:
        return "\n".join(
            f"--- {name}:\n{(self.home / name).read_text()}" for name in ("stdout", "stderr")
        )


def start_runner(stack: S3Stack, settings: ServiceSettings, home: Path, job: str) -> Runner:
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_HA_", "AWS_"))}
    env |= {**stack_env(settings), **s3_env(stack), "CKPT_HA_HOME": str(home)}
    command = [
        sys.executable, "-m", "ckpt_ha.lab.examples.numpy_mlp", "--steps", str(STEPS),
        "--checkpoint-every", str(EVERY), "--seed", "5", "--sleep-per-step", str(STEP_S),
    ]  # fmt: skip
    run_id = f"run-{job}"
    with (home / "stdout").open("wb") as out, (home / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_ha.cli.main", "run", "--job", job, "--run-id", run_id,
             "--plan-timeout", "60", "--", *command],
            env=env, stdout=out, stderr=err,
        )  # fmt: skip
    return Runner(proc, home, job, run_id)


def folder(job: str, step: int) -> str:
    return f"{job}/step-{step:08d}"


def keys_under(stack: S3Stack, where: str = "") -> list[str]:
    """Every key in the folder ``where`` (the whole root by default)."""
    return [o.key for o in stack.store.list(f"{where}/" if where else "")]


@contextlib.asynccontextmanager
async def janitor_on(
    stack: S3Stack, settings: ServiceSettings
) -> AsyncIterator[tuple[Janitor, ShiftedClock]]:
    """The retention-janitor's rounds on a `ShiftedClock` and the stack's S3 root (`open_store`,
    as the process opens it). The janitor process of the stack, on real time, has nothing to do
    meanwhile."""
    store = open_store(
        stack.root,
        endpoint_url=stack.endpoint,
        access_key=FAKE_ACCESS_KEY,
        secret_key=FAKE_SECRET_KEY,
    )
    clock = ShiftedClock()
    prefix = settings.registry_prefix
    async with janitor_rounds(settings.bus(), settings.redis_url, prefix, store, clock) as janitor:
        yield janitor, clock


# Three processes run one after the other (the job's two attempts, the CLI twice): ~45 s on an
# idle machine; the budget leaves room for a loaded one.
@pytest.mark.timeout(240)
async def test_a_killed_job_resumes_from_s3_then_retention_and_reconcile_clean_the_bucket(
    s3_stack: S3Stack, settings: ServiceSettings, tmp_path: Path
) -> None:
    job = "mlp-s3"
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)

    async def valid_at(*steps: int) -> dict[int, CheckpointRecord]:
        found = {r.step: r for r in await registry.by_job(job) if r.state is S.VALID}
        return {s: found[s] for s in steps} if all(s in found for s in steps) else {}

    async def one(event_type: str, **match: object) -> dict[str, object]:
        async def probe() -> list[dict[str, object]]:
            found = await events(settings, event_type, job)
            return [d for d in found if all(d.get(k) == v for k, v in match.items())]

        [found] = await wait_for(probe, timeout=60, what=f"{event_type} {match}")
        return found

    runner = start_runner(s3_stack, settings, tmp_path / "runner", job)
    try:
        # Past step 20, attempt 1 is frozen (SIGSTOP) until its kill: however slow the
        # machine, it never gets to save step 30 itself.
        await wait_for(
            lambda: asyncio.sleep(0, runner.last_step() > 20), timeout=60, what="step 21"
        )
        pid = runner.child_pid(1)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        assert runner.last_step() < 30, f"stopped at step {runner.last_step()}: too late"
        await wait_for(lambda: valid_at(20), timeout=60, what="step 20 saved to S3 and verified")
        # Attempt 1 dies mid-save of step 30 (announced writing, its index on S3, no more): the
        # coordinator is to delete that partial write once the resume is verified.
        partial = folder(job, 30)
        bus = sdk.BusEndpoint(
            settings.nats_url, prefix=settings.subject_prefix, job_key=job_key(job)
        )
        with pytest.raises(Killed):
            await asyncio.to_thread(
                sdk.save, DyingS3Store(s3_stack), job, 30, {"weights": np.zeros(4)},
                run_id=runner.run_id, attempt=1, bus=bus,
            )  # fmt: skip
        assert keys_under(s3_stack, partial), "the partial write is on S3"

        async def partial_writing() -> bool:
            recs = await registry.by_job(job)
            return any(r.uri.endswith(partial) and r.state is S.WRITING for r in recs)

        await wait_for(partial_writing, timeout=20, what="the partial write registered")
        os.kill(pid, signal.SIGKILL)

        # The coordinator plans from the newest valid checkpoint, on S3.
        planned = await one("resume.planned")
        assert (planned["step"], planned["attempt"]) == (20, 2)
        assert planned["checkpoint_uri"] == f"{s3_stack.root}/{folder(job, 20)}"
        latest = await registry.latest_valid(job)
        assert latest is not None
        assert latest.checkpoint_id == planned["checkpoint_id"]

        # The relaunched attempt loads it from S3, continues and finishes.
        code = await asyncio.to_thread(runner.proc.wait, timeout=60)
        assert code == 0, runner.output()
    finally:
        if runner.proc.poll() is None:
            runner.proc.kill()
            runner.proc.wait()
    loaded = await one("resume.loaded")
    assert (loaded["checkpoint_id"], loaded["step"]) == (planned["checkpoint_id"], 20)
    await one("resume.verified", plan_id=planned["plan_id"])
    closed = await one("resume.closed", plan_id=planned["plan_id"])
    assert closed["cleaned"] == [f"{s3_stack.root}/{partial}"], closed
    assert keys_under(s3_stack, partial) == [], "the partial write is gone from the bucket"

    async def partial_tombstoned() -> CheckpointRecord | None:
        recs = await registry.by_job(job)
        found = [r for r in recs if r.uri.endswith(partial) and r.state is S.DELETED]
        return found[0] if found else None

    # ... and its record with it: deleted, the coordinator's tombstone saying so (R6).
    reclaimed = await wait_for(partial_tombstoned, timeout=20, what="the partial write deleted")
    assert reclaimed.tombstone is not None
    assert reclaimed.tombstone.actor == "restore-coordinator"

    # Retention on S3: beyond keep_last (2, the default tier) step 10 expires, then goes.
    kept = await wait_for(lambda: valid_at(20, 30), timeout=30, what="steps 20 and 30 valid")
    old = await valid_at(10)
    async with janitor_on(s3_stack, settings) as (janitor, clock):
        clock.offset = timedelta(days=1)
        expired = (await janitor.run_once([job])).expired
        assert set(expired) >= {r.checkpoint_id for r in old.values()}, expired

        async def all_expired() -> bool:
            recs = [await registry.get(c) for c in expired]
            return all(r is not None and r.state is S.EXPIRED for r in recs)

        await wait_for(all_expired, timeout=20, what="the expiries recorded")
        clock.offset = timedelta(days=2)
        deleted = (await janitor.run_once([job])).deleted
    assert set(deleted) == set(expired)

    async def tombstones() -> list[CheckpointRecord]:
        recs = [await registry.get(c) for c in deleted]
        done = [r for r in recs if r is not None and r.tombstone is not None]
        return done if len(done) == len(deleted) else []

    gone = await wait_for(tombstones, timeout=20, what="the deletions recorded")
    assert {r.state for r in gone} == {S.DELETED}
    assert {r.step for r in gone} == {10}  # the partial write of attempt 1 went at closure
    for step in (10, 30):
        assert keys_under(s3_stack, folder(job, step)) == [], f"step {step} still in the bucket"
    for step, rec in kept.items():
        assert keys_under(s3_stack, key_for_uri(s3_stack.store, rec.uri) or ""), step
        assert (await registry.get(rec.checkpoint_id)) == rec
    newest = sdk.load(s3_stack.store, key_for_uri(s3_stack.store, kept[30].uri) or "")
    assert newest.manifest.step == 30

    # Reconcile on S3: nothing the loop wrote is unknown; only what the test puts there is (in
    # no checkpoint folder: the watcher would announce an object in `<job>/<folder>/` as one).
    strays = ["stray.bin", "orphans/a.bin", f"{job}/notes.txt"]
    for key in strays:
        s3_stack.store.put(key, b"stray")
    before = keys_under(s3_stack)
    home, env = tmp_path / "cli", s3_env(s3_stack)
    code, out, err = await cli(settings, home, "reconcile", "--json", env=env)
    assert code == 1, err
    assert sorted(o["key"] for o in json.loads(out)["unknown"]) == sorted(strays)
    code, out, err = await cli(
        settings, home, "reconcile", "--delete", "--reason", "e2e strays", "--min-age", "0",
        "--yes", "--json", env=env,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["deleted"] == len(strays)
    assert keys_under(s3_stack) == [k for k in before if k not in strays]
    logged = await registry.reconcile_log()
    assert sorted(e["key"] for e in logged) == sorted(strays)
    assert {e["reason"] for e in logged} == {"e2e strays"}
    assert all(procs.is_alive(p) for p in s3_stack.processes)
    await registry.close()
