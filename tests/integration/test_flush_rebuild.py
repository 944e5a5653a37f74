"""Redis loses everything (FLUSHALL) and ``ckpt-ha registry rebuild`` brings back, key for key,
what the services had decided: checkpoint records, declared and chosen tiers, owners, the
restore-coordinator's starts, trajectories, failures, plans, decisions and verdicts, the
pins, and the retention-janitor's own view of resumes. Then the system goes on as if nothing
happened: the next failure is planned, and retention keeps what the declared tier keeps.

The real registrar, restore-coordinator and retention-janitor run in-process on real NATS and
Redis; the flow goes through their consumers. Compared: every key under the registry prefix but
the coordinator's leases (who decides a failure right now: transient, released after each
decision). Normalised: only expiry times, which must be present on the same keys and agree
within a minute (the live services set them when they handled an event, the rebuild from the
event's own time).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
import redis.asyncio as aioredis

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointVerifiedV1,
    FailureSide,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobHeartbeatV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    JobStartedV2,
    JobSucceededV1,
    Tolerance,
)
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV2
from ckpt_ha.core.tiers import MISSED_HEARTBEATS
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.retention_janitor.app import RetentionJanitor
from ckpt_ha.retention_janitor.app import build as build_janitor
from ckpt_ha.retention_janitor.domain import Action
from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli
from tests.support.registry_snapshot import (
    JOB_INDEX_SEQ,
    TRANSIENT,
    differences,
    flush,
    snapshot,
)

pytestmark = pytest.mark.integration

ENV = RuntimeEnvironment(framework="torch", framework_version="2.3.0", python_version="3.11.9")
TOPO = Topology(world_size=2)
LOSS = Tolerance(metric="loss", abs=0.01, rel=0.01)


@pytest.fixture
def settings(settings: ServiceSettings, tmp_path: Path) -> ServiceSettings:
    """One storage root for every service and the CLI (a location must be its job's)."""
    (tmp_path / "store").mkdir()
    return settings.model_copy(update={"storage_root": str(tmp_path / "store")})


class Services:
    """The three services whose state lives under the registry prefix, in-process."""

    def __init__(self, settings: ServiceSettings) -> None:
        common = settings.model_dump()
        self.registrar: Registrar = build_registrar(RegistrarSettings.model_validate(common))
        self.coordinator: RestoreCoordinator = build_coordinator(
            RestoreCoordinatorSettings.model_validate({**common, "load_failed_grace_s": 5.0})
        )
        self.janitor: RetentionJanitor = build_janitor(
            RetentionJanitorSettings.model_validate({**common, "retention_interval_s": 0})
        )

    async def start(self) -> None:
        for svc in (self.registrar, self.coordinator, self.janitor):
            await svc.bus.broker.start()

    async def stop(self) -> None:
        for svc in (self.registrar, self.coordinator, self.janitor):
            await svc.bus.broker.stop()
        await self.registrar.registry.close()
        await self.coordinator.state.close()
        await self.janitor.registry.close()


@pytest.fixture
async def redis_client(settings: ServiceSettings) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    yield r
    await r.aclose()


class Flow:
    """Publishes what runners, training jobs, the watcher and the checker would."""

    def __init__(self, settings: ServiceSettings, producer: Bus, services: Services) -> None:
        self.settings = settings
        self.producer = producer
        self.services = services
        self.n = 0
        self.heartbeat_at = datetime.now(UTC)

    async def publish(self, data: EventData, at: datetime | None = None) -> None:
        self.n += 1
        at = at or datetime.now(UTC)
        await self.producer.publish(build(data, source="test/flow", time=at, key=f"e{self.n}"))

    async def started(
        self,
        job: str,
        attempt: int,
        *,
        tier: str,
        plan_id: str | None = None,
        heartbeat_s: float | None = None,
        at: datetime | None = None,
    ) -> None:
        policy = JobPolicy(
            tolerances=(LOSS,), continuity_steps=2, max_restarts=10, max_storage_errors=10
        )
        started = JobStartedV1(
            job_id=job, run_id="run-1", attempt=attempt, tier=tier, policy=policy,
            environment=ENV, topology=TOPO, code_version="abc", plan_id=plan_id,
        )  # fmt: skip
        if heartbeat_s is not None:  # v2: its heartbeat deadline is watched (the tier's)
            started = JobStartedV2(**started.model_dump(), heartbeat_s=heartbeat_s)
        await self.publish(started, at)

    async def progress(
        self, job: str, steps: range, *, attempt: int = 1, plan_id: str | None = None
    ) -> None:
        for step in steps:
            await self.publish(
                JobProgressV1(
                    job_id=job, run_id="run-1", attempt=attempt, step=step,
                    data_position=step * 64, rng_fingerprint=f"rng-{step}",
                    metrics={"loss": 10.0 / step}, plan_id=plan_id,
                )
            )  # fmt: skip

    async def failed(self, job: str, attempt: int, plan_id: str | None = None) -> None:
        await self.publish(
            JobFailedV1(
                job_id=job, run_id="run-1", attempt=attempt, cause=FailureCause.NODE_EXIT,
                signal=9, signature=f"node_exit:{attempt}", side=FailureSide.INFRASTRUCTURE,
                plan_id=plan_id,
            )
        )  # fmt: skip

    async def valid(
        self, job: str, ckpt: str, step: int, *, attempt: int = 1, project: str | None = None
    ) -> None:
        uri = self.services.registrar.store.uri(f"{job}/step-{step}")
        created = datetime.now(UTC) - timedelta(minutes=5)
        identity = CheckpointIdentity(
            job_id=job, run_id="run-1", attempt=attempt, environment=ENV, topology=TOPO,
            code_version="abc", created_at=created, project=project,
        )  # fmt: skip
        await self.publish(
            CheckpointCommittedV1(
                job_id=job, checkpoint_id=ckpt, uri=uri, run_id="run-1", step=step,
                format=CheckpointFormat.NATIVE, identity=identity,
            )
        )  # fmt: skip
        await self.publish(
            CheckpointVerifiedV1(job_id=job, checkpoint_id=ckpt, uri=uri, checks=("sizes",))
        )
        await self.until(lambda: self.registered(ckpt), f"{ckpt} registered valid")

    async def registered(self, ckpt: str) -> bool:
        rec = await self.services.registrar.registry.get(ckpt)
        return rec is not None and rec.state.value == "valid"

    async def until(self, probe: Any, what: str) -> Any:
        return await wait_for(probe, timeout=30, what=what)

    async def events(self, event_type: str, job: str) -> list[dict[str, Any]]:
        out = []
        for msg in await stream_messages(self.settings.nats_url, self.settings.events_stream):
            doc = json.loads(msg.data)
            if doc["type"].startswith(f"ckpt-ha.{event_type}.v") and doc["data"]["job_id"] == job:
                out.append(doc["data"])
        return out

    async def event(self, event_type: str, job: str, **match: Any) -> dict[str, Any]:
        async def found() -> dict[str, Any] | None:
            for d in await self.events(event_type, job):
                if all(d.get(k) == v for k, v in match.items()):
                    return d
            return None

        result: dict[str, Any] = await self.until(found, f"{event_type} of {job} {match}")
        return result

    async def settled(self) -> None:
        """Every consumer of the streams handled everything published so far."""

        async def idle() -> bool:
            nc = await nats.connect(self.settings.nats_url)
            try:
                js = nc.jetstream()
                infos = [
                    *await js.consumers_info(self.settings.events_stream),
                    *await js.consumers_info(self.settings.progress_stream),
                ]
                return all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)
            finally:
                await nc.close()

        await self.until(idle, "every consumer idle")


async def test_a_flushed_registry_is_rebuilt_key_for_key_and_the_system_goes_on(
    settings: ServiceSettings, producer: Bus, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    services = Services(settings)
    await services.start()
    flow = Flow(settings, producer, services)
    try:
        await _live_flow(flow, tmp_path)
        await flow.settled()
    finally:
        await services.stop()
    prefix = settings.registry_prefix
    before = await snapshot(redis_client, prefix, transient=TRANSIENT)
    spaces = {k.removeprefix(f"{prefix}:").split(":")[0] for k in before}
    assert {"ckpt", "tier-declared", "tier", "owner-log", "coord", "pins", "janitor"} <= spaces
    # The janitor's own view of resumes: job B's plan still pins its checkpoints (job A's pins
    # were released by its resumed attempt's newer checkpoint), rebuilt key for key below.
    janitor = {k.removeprefix(f"{prefix}:janitor:resumes:") for k in before if ":janitor:" in k}
    assert {"job-a", "job-b"} <= janitor
    assert json.loads(before[f"{prefix}:janitor:resumes:job-a"].value)["pins"] == {}
    assert json.loads(before[f"{prefix}:janitor:resumes:job-b"].value)["pins"] != {}
    coord = {k.split(":coord:")[1].split(":")[0] for k in before if ":coord:" in k}
    assert coord == {"started", "traj", "trajidx", "last", "failures", "restarts", "storage",
                     "excluded", "decision", "plan", "obs", "verdict", "watch", "due",
                     "attention", "restarted", "jobs"}  # fmt: skip
    due = f"{prefix}:coord:due"
    assert before[due].value == [
        ("job-e", (flow.heartbeat_at + timedelta(seconds=MISSED_HEARTBEATS * 10.0)).timestamp())
    ]

    # FLUSHALL, for this registry only (the Redis is shared with other tests).
    everything = await snapshot(redis_client, prefix, ordinals=True)
    # Transient, not rebuilt: when the coordinator last heard from job E (on its own clock);
    # and the job index's ordinal counter, which a compared snapshot leaves out.
    assert set(everything) - set(before) == {
        f"{prefix}:coord:heard",
        f"{prefix}{JOB_INDEX_SEQ}",
    }
    assert await flush(redis_client, prefix) == len(everything)  # every key goes
    env = {"CKPT_HA_STORAGE_ROOT": settings.storage_root}
    code, out, err = await cli(settings, tmp_path, "registry", "rebuild", env=env)
    assert code == 0, err
    after = await snapshot(redis_client, prefix, transient=TRANSIENT)
    assert differences(before, after, expiry_slack_s=60) == []  # job E's deadline included
    assert "skipped none" in out

    # The system goes on: the resumed attempt fails and is planned (its start was rebuilt; it
    # is not dead-lettered), and retention keeps what the declared tier keeps.
    services = Services(settings)
    await services.start()
    try:
        plan = await flow.event("resume.planned", "job-a", attempt=3)
        await flow.failed("job-a", 3, plan_id=plan["plan_id"])
        again = await flow.event("resume.planned", "job-a", attempt=4)
        assert again["checkpoint_id"] == "a-c4"
        assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []
        tier = await services.janitor.registry.tier_of("job-a")
        assert (tier.tier.name, tier.source) == ("standard", "declared")
        decisions = await services.janitor.janitor.dry_run(["job-a"])
        assert {d.tier for d in decisions} == {"standard"}
        assert [d.checkpoint_id for d in decisions if d.action is not Action.KEEP] == []
    finally:
        await services.stop()


async def _live_flow(flow: Flow, home: Path) -> None:
    """Job A: declared tier, progress, a failure and its plan with pins, a load failure and
    the fallback, a verified resume, a newer checkpoint that releases the pins. Job B: a plan
    whose pins are still held, a chosen tier, an ownership transfer. Job C succeeds (its starts
    may expire); job D escalates (no valid checkpoint)."""
    for job, tier in (("job-a", "standard"), ("job-b", "critical")):
        await flow.started(job, 1, tier=tier)
    await flow.settled()  # the janitor knows the declared tiers before checkpoints come
    for i, step in enumerate((100, 200, 300), start=1):
        await flow.valid("job-a", f"a-c{i}", step)
    for i, step in enumerate((50, 60), start=1):
        await flow.valid("job-b", f"b-c{i}", step, project="vision")
    await flow.progress("job-a", range(195, 211))
    await flow.progress("job-a", range(295, 311))
    await flow.progress("job-b", range(55, 66))
    await flow.settled()

    await flow.failed("job-a", 1)
    first = await flow.event("resume.planned", "job-a", attempt=2)
    assert first["pinned"] == ["a-c3", "a-c2"]
    await flow.started("job-a", 2, tier="standard", plan_id=first["plan_id"])
    await flow.settled()
    await flow.publish(
        ResumeLoadFailedV2(
            job_id="job-a", plan_id=first["plan_id"], run_id="run-1", checkpoint_id="a-c3",
            reason="checksum mismatch in shard 0", side=FailureSide.JOB,
            blame=LoadBlame.CHECKPOINT,
        )
    )  # fmt: skip
    await flow.failed("job-a", 2, plan_id=first["plan_id"])
    fallback = await flow.event("resume.planned", "job-a", attempt=3)
    assert (fallback["checkpoint_id"], fallback["fallback_from"]) == ("a-c2", "a-c3")
    await flow.started("job-a", 3, tier="standard", plan_id=fallback["plan_id"])
    await flow.settled()
    await flow.progress("job-a", range(201, 203), attempt=3, plan_id=fallback["plan_id"])
    await flow.event("resume.verified", "job-a")
    await flow.event("resume.closed", "job-a")
    await flow.valid("job-a", "a-c4", 400, attempt=3)

    await flow.failed("job-b", 1)
    await flow.event("resume.planned", "job-b", attempt=2)
    code, _, err = await flow_cli(flow, home, "tier", "set", "--job", "job-b", "standard",
                                  "--reason", "worth less now", "--actor", "alice")  # fmt: skip
    assert code == 0, err
    code, _, err = await flow_cli(flow, home, "owner", "transfer", "--from", "vision", "--to",
                                  "nlp", "--reason", "team moved", "--actor", "bob")  # fmt: skip
    assert code == 0, err

    await flow.started("job-c", 1, tier="standard")
    await flow.settled()  # a job runs a while after its start
    await flow.progress("job-c", range(1, 4))
    await flow.publish(JobSucceededV1(job_id="job-c", run_id="run-1", attempt=1, last_step=3))
    await flow.started("job-d", 1, tier="standard")
    await flow.settled()
    await flow.failed("job-d", 1)
    await flow.event("resume.escalated", "job-d")
    # Job E runs with heartbeats: its deadline (four missed 10 s heartbeats after its last
    # heartbeat) is watched, and a rebuild must bring it back to the second.
    t0 = datetime.now(UTC).replace(microsecond=0)
    await flow.started("job-e", 1, tier="standard", heartbeat_s=10.0, at=t0)
    await flow.settled()
    flow.heartbeat_at = t0 + timedelta(seconds=10)
    beat = JobHeartbeatV1(job_id="job-e", run_id="run-1", attempt=1, sequence=1, last_step=None)
    await flow.publish(beat, flow.heartbeat_at)


async def flow_cli(flow: Flow, home: Path, *args: str) -> tuple[int, str, str]:
    return await cli(flow.settings, home, *args)
