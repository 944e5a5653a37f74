"""The restore-coordinator against real NATS and Redis, with the real registrar in-process:
plans, duplicates and replicas, load failures, stop conditions, compatibility, continuity, pins
and closure."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCopyChangedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointState,
    CheckpointVerifiedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    CopyState,
    FailureSide,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import (
    CompatibilityRule,
    FailureCause,
    JobFailedV1,
    JobPolicy,
    JobProgressV1,
    JobStartedV1,
    Tolerance,
)
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV1, ResumeLoadFailedV2
from ckpt_ha.core.records import Tombstone
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.cli_tools import cli

pytestmark = pytest.mark.integration

ENV = RuntimeEnvironment(
    framework="torch", framework_version="2.3.0", python_version="3.11.9", image="trainer:1"
)
TOPO = Topology(world_size=2)
NOW = datetime.now(UTC).replace(microsecond=0)
CKPT_T = NOW - timedelta(hours=1)


@pytest.fixture
def settings(settings: ServiceSettings, tmp_path: Path) -> ServiceSettings:
    """One storage root for the registrar and the coordinator (a location must be its job's
    in the registrar's root, and the coordinator cleans up in the same)."""
    (tmp_path / "store").mkdir()
    return settings.model_copy(update={"storage_root": str(tmp_path / "store")})


@pytest.fixture
def coord_settings(settings: ServiceSettings) -> RestoreCoordinatorSettings:
    return RestoreCoordinatorSettings.model_validate(
        {
            **settings.model_dump(),
            "load_failed_grace_s": 2.0,
            "lease_ttl_s": 5.0,
        }
    )


async def _start(s: RestoreCoordinatorSettings) -> RestoreCoordinator:
    svc = build_coordinator(s)
    await svc.bus.broker.start()
    return svc


async def _stop(svc: RestoreCoordinator) -> None:
    await svc.bus.broker.stop()
    await svc.state.close()


@pytest.fixture
async def coordinator(
    coord_settings: RestoreCoordinatorSettings, registrar: Registrar
) -> AsyncIterator[RestoreCoordinator]:
    svc = await _start(coord_settings)
    yield svc
    await _stop(svc)


async def events_of(settings: ServiceSettings, event_type: str) -> list[dict[str, Any]]:
    msgs = await stream_messages(settings.nats_url, settings.events_stream)
    docs = [json.loads(m.data) for m in msgs]
    return [d["data"] for d in docs if d["type"].rsplit(".v", 1)[0] == f"ckpt-ha.{event_type}"]


def waiter(settings: ServiceSettings) -> Callable[..., Awaitable[list[dict[str, Any]]]]:
    async def wait(event_type: str, job: str, n: int = 1, **match: Any) -> list[dict[str, Any]]:
        async def probe() -> list[dict[str, Any]]:
            found = [
                d
                for d in await events_of(settings, event_type)
                if d["job_id"] == job and all(d.get(k) == v for k, v in match.items())
            ]
            return found if len(found) >= n else []

        return await wait_for(probe, timeout=15, what=f"{n} {event_type} for {job} {match}")

    return wait


def _ev(data: EventData, key: str, time: datetime = NOW) -> Envelope[EventData]:
    return build(data, source="test/runner", time=time, key=key)


def started(
    job: str,
    attempt: int = 1,
    *,
    policy: JobPolicy | None = None,
    env: RuntimeEnvironment = ENV,
    plan_id: str | None = None,
) -> Envelope[EventData]:
    return _ev(
        JobStartedV1(
            job_id=job,
            run_id="run-1",
            attempt=attempt,
            policy=policy or JobPolicy(),
            environment=env,
            topology=TOPO,
            code_version="abc",
            plan_id=plan_id,
        ),
        key=f"started-{attempt}",
        time=NOW + timedelta(seconds=attempt * 100),
    )


def failed(
    job: str, attempt: int = 1, *, key: str = "f", plan_id: str | None = None, sig: str = ""
) -> Envelope[EventData]:
    return _ev(
        JobFailedV1(
            job_id=job,
            run_id="run-1",
            attempt=attempt,
            cause=FailureCause.NODE_EXIT,
            signal=9,
            signature=sig or f"node_exit:{attempt}",
            plan_id=plan_id,
        ),
        key=f"{key}-{attempt}",
        time=NOW + timedelta(seconds=attempt * 100 + 50),
    )


def progress(
    job: str,
    step: int,
    *,
    attempt: int = 1,
    plan_id: str | None = None,
    loss: float | None = None,
    at: datetime | None = None,
) -> Envelope[EventData]:
    return _ev(
        JobProgressV1(
            job_id=job,
            run_id="run-1",
            attempt=attempt,
            step=step,
            data_position=step * 64,
            rng_fingerprint=f"rng-{step}",
            metrics={"loss": 10.0 / step if loss is None else loss},
            plan_id=plan_id,
        ),
        key=f"p-{attempt}-{step}",
        time=at or NOW + timedelta(seconds=attempt * 100 + step / 10),
    )


async def make_valid(
    registrar: Registrar,
    producer: Bus,
    job: str,
    ckpt: str,
    step: int,
    *,
    env: RuntimeEnvironment = ENV,
    attempt: int = 1,
    folder: str | None = None,
    expect: CheckpointState = CheckpointState.VALID,
    fmt: CheckpointFormat = CheckpointFormat.NATIVE,
) -> None:
    """Commit and verify a checkpoint; wait until the registry holds it in ``expect``."""
    uri = registrar.store.uri(folder or f"{job}/step-{step}")
    identity = CheckpointIdentity(
        job_id=job,
        run_id="run-1",
        attempt=attempt,
        environment=env,
        topology=TOPO,
        code_version="abc",
        created_at=CKPT_T,
    )
    await producer.publish(
        build(
            CheckpointCommittedV1(
                job_id=job,
                checkpoint_id=ckpt,
                uri=uri,
                run_id="run-1",
                step=step,
                format=fmt,
                identity=identity,
            ),
            source="test/watcher",
            time=CKPT_T + timedelta(seconds=step),
            key="c",
        )
    )
    await producer.publish(
        build(
            CheckpointVerifiedV1(job_id=job, checkpoint_id=ckpt, uri=uri, checks=("sizes",)),
            source="test/checker",
            time=CKPT_T + timedelta(seconds=step + 1),
            key="v",
        )
    )

    async def reached() -> bool:
        rec = await registrar.registry.get(ckpt)
        return rec is not None and rec.state is expect

    await wait_for(reached, what=f"{ckpt} {expect.value}")


async def three_checkpoints(registrar: Registrar, producer: Bus, job: str) -> None:
    for i, step in enumerate((100, 200, 300), start=1):
        await make_valid(registrar, producer, job, f"{job}-c{i}", step)


async def consumer_idle(settings: ServiceSettings, durable: str) -> bool:
    reports = durable.endswith(("--progress", "--heartbeat"))  # on the progress stream
    stream = settings.progress_stream if reports else settings.events_stream
    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


async def settled(settings: ServiceSettings, *consumers: str) -> None:
    """Wait until the coordinator's consumers handled everything published so far (they run
    independently: a test that needs progress recorded before a failure waits for it)."""
    for consumer in consumers:
        durable = f"restore-coordinator--{consumer}"
        await wait_for(lambda d=durable: consumer_idle(settings, d), what=f"{durable} idle")


async def test_failure_plans_the_newest_valid_checkpoint(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    job = "job-plan"
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job))
    for step in (300, 320, 350):
        await producer.publish(progress(job, step))
    await settled(settings, "started", "progress")
    await producer.publish(failed(job))
    [plan] = await waiter(settings)("resume.planned", job)
    assert plan["checkpoint_id"] == f"{job}-c3"
    assert plan["attempt"] == 2
    assert plan["step"] == plan["expected_step"] == 300
    assert (plan["mode"], plan["compatibility"]) == ("exact_resume", "identical")
    assert plan["recompute_steps"] == 50
    assert plan["recompute_seconds"] == pytest.approx(5.0)  # progress at 300 → at 350
    assert plan["pinned"] == [f"{job}-c3", f"{job}-c2"]
    assert plan["failed_run_id"] == "run-1"
    pins = {p.checkpoint_id: p for p in await coordinator.pins.pins(job)}
    assert sorted(pins) == [f"{job}-c2", f"{job}-c3"]
    assert pins[f"{job}-c3"].reason == "restored from"
    assert pins[f"{job}-c2"].reason == "fallback"
    assert {(p.plan_id, p.restored_step, p.attempt) for p in pins.values()} == {
        (plan["plan_id"], 300, 2)
    }
    labels = {"service": "restore-coordinator", "outcome": "planned", "detail": "exact_resume"}
    assert coordinator.metrics.registry.get_sample_value(
        "ckpt_ha_restore_decisions_total", labels
    ) == pytest.approx(1.0)


async def test_duplicated_failure_and_two_replicas_make_one_plan(
    coordinator: RestoreCoordinator,
    coord_settings: RestoreCoordinatorSettings,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    second = await _start(coord_settings)
    try:
        job = "job-dup"
        await three_checkpoints(registrar, producer, job)
        await producer.publish(started(job))
        for copy in range(3):  # a scheduler redelivering: new event ids, same content
            await producer.publish(failed(job, key=f"copy{copy}"))
        await waiter(settings)("resume.planned", job)
        await settled(settings, "failed")
        plans = await events_of(settings, "resume.planned")
        assert len([p for p in plans if p["job_id"] == job]) == 1
        assert len([d for d in await events_of(settings, "job.failed") if d["job_id"] == job]) == 3
    finally:
        await _stop(second)


async def test_load_failure_quarantines_and_falls_back(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    job = "job-load"
    wait = waiter(settings)
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job))
    await producer.publish(failed(job))
    [first] = await wait("resume.planned", job)
    await producer.publish(started(job, 2, plan_id=first["plan_id"]))
    # A v1 load failure (an SDK older than v2) is upcast: not infrastructure → it blames the
    # checkpoint, as v1 consumers treated it.
    await producer.publish(
        _ev(
            ResumeLoadFailedV1(
                job_id=job,
                plan_id=first["plan_id"],
                run_id="run-1",
                checkpoint_id=first["checkpoint_id"],
                reason="checksum mismatch in shard 0",
                side=FailureSide.JOB,
            ),
            key="lf",
        )
    )
    await producer.publish(failed(job, 2, plan_id=first["plan_id"]))
    fallback = (await wait("resume.planned", job, attempt=3))[0]
    assert fallback["checkpoint_id"] == f"{job}-c2"
    assert fallback["fallback_from"] == f"{job}-c3"
    [q] = await wait("checkpoint.quarantined", job)
    assert q["reason"] == "load failed: checksum mismatch in shard 0"

    async def quarantined() -> bool:
        rec = await registrar.registry.get(f"{job}-c3")
        return rec is not None and rec.state is CheckpointState.QUARANTINED

    await wait_for(quarantined, what="registry shows the checkpoint quarantined")
    await settled(settings, "failed")
    plans = [p for p in await events_of(settings, "resume.planned") if p["job_id"] == job]
    assert len(plans) == 2


async def test_restart_loop_escalates_and_stops_planning(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    job = "job-loop"
    wait = waiter(settings)
    policy = JobPolicy(max_restarts=2, restart_window_s=3600)
    await three_checkpoints(registrar, producer, job)
    for attempt in (1, 2):
        await producer.publish(started(job, attempt, policy=policy))
        await producer.publish(progress(job, 300 + attempt, attempt=attempt))
        await producer.publish(failed(job, attempt))
        await wait("resume.planned", job, attempt=attempt + 1)
    await producer.publish(started(job, 3, policy=policy))
    await producer.publish(failed(job, 3))
    [esc] = await wait("resume.escalated", job)
    assert esc["reason"] == "restart_loop"
    assert esc["next_step"] == "docs/RUNBOOK.md#stop-runaway-retries: stop runaway retries"
    assert "2 automatic restores" in esc["detail"]
    await settled(settings, "failed")
    assert not await wait_none(settings, job, attempt=4)


async def wait_none(settings: ServiceSettings, job: str, **match: Any) -> list[dict[str, Any]]:
    plans = await events_of(settings, "resume.planned")
    return [p for p in plans if p["job_id"] == job and all(p[k] == v for k, v in match.items())]


async def test_same_failure_repeating_escalates(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    job = "job-same"
    policy = JobPolicy(max_same_failure=2, max_restarts=10)
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job, 1, policy=policy))
    await producer.publish(failed(job, 1, sig="oom:abc"))
    await waiter(settings)("resume.planned", job)
    await producer.publish(started(job, 2, policy=policy))
    await producer.publish(failed(job, 2, sig="oom:abc"))
    [esc] = await waiter(settings)("resume.escalated", job)
    assert esc["reason"] == "same_failure_repeating"


NEW_FW = ENV.model_copy(update={"framework_version": "2.4.0"})


@pytest.mark.parametrize(
    ("policy", "outcome"),
    [
        (JobPolicy(), ("escalated", "compatibility_unknown")),
        (JobPolicy(allow_weights_only=True), ("weights_only_init", "unknown")),
        (
            JobPolicy(compatible=(CompatibilityRule(field="framework_version", written="2.3.0"),)),
            ("compatible_resume", "declared_compatible"),
        ),
    ],
)
async def test_compatibility_decides_the_mode(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
    policy: JobPolicy,
    outcome: tuple[str, str],
    tmp_path: Path,
) -> None:
    job = "job-compat"
    wait = waiter(settings)
    await make_valid(registrar, producer, job, "c1", 100)
    await producer.publish(started(job, policy=policy, env=NEW_FW))
    await producer.publish(failed(job))
    if outcome[0] == "escalated":
        [esc] = await wait("resume.escalated", job)
        assert esc["reason"] == outcome[1]
        assert "framework_version: 2.3.0 -> 2.4.0 (no declared rule)" in esc["detail"]
        assert esc["next_step"].startswith("docs/RUNBOOK.md#prepare-environment")
        await settled(settings, "failed")
        assert not await wait_none(settings, job)
        # On-call reads the same differences back from the stream, one per line.
        rc, out, err = await cli(settings, tmp_path, "restores", "--job", job)
        assert rc == 0, err
        assert "automatic restore stopped: compatibility_unknown" in out
        assert "\n" + " " * 35 + "framework_version: 2.3.0 -> 2.4.0 (no declared rule)" in out
        assert "next step: docs/RUNBOOK.md#prepare-environment" in out
        return
    [plan] = await wait("resume.planned", job)
    assert (plan["mode"], plan["compatibility"]) == outcome
    assert any("framework_version: 2.3.0 -> 2.4.0" in r for r in plan["reasons"])


@pytest.mark.parametrize("off", [0.0, 0.5])
async def test_continuity_after_resume(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
    off: float,
) -> None:
    job = "job-cont"
    wait = waiter(settings)
    loss = Tolerance(metric="loss", abs=0.01, rel=0.01)
    policy = JobPolicy(tolerances=(loss,), continuity_steps=2)
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job, policy=policy))
    for step in range(295, 311):
        await producer.publish(progress(job, step))
    await settled(settings, "started", "progress")
    await producer.publish(failed(job))
    [plan] = await wait("resume.planned", job)
    pid = plan["plan_id"]
    await producer.publish(started(job, 2, policy=policy, plan_id=pid))
    for step in (301, 302):
        await producer.publish(progress(job, step, attempt=2, plan_id=pid, loss=10.0 / step + off))
    if off == 0.0:
        [verified] = await wait("resume.verified", job)
        assert verified["plan_id"] == pid
        assert verified["step"] == 302
        assert all(c["ok"] for c in verified["comparisons"])
        names = {c["name"] for c in verified["comparisons"]}
        assert {"first step", "step 301: data_position", "step 302: loss"} <= names
        await wait("resume.closed", job)
    else:
        [diverged] = await wait("resume.diverged", job)
        assert diverged["step"] == 301
        assert "step 301: loss" in diverged["reason"]
        assert not await events_of(settings, "resume.verified")


async def test_newer_valid_checkpoint_after_resume_unpins(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    job = "job-pins"
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job))
    await producer.publish(failed(job))
    [plan] = await waiter(settings)("resume.planned", job)
    assert len(await coordinator.pins.pins(job)) == 2
    await producer.publish(started(job, 2, plan_id=plan["plan_id"]))
    # A late checkpoint of the failed attempt is fenced (R17) and releases no pin; the resumed
    # one's does.
    await wait_for(
        lambda: registrar.registry.planned_attempt(job, "run-1"), what="the registrar's fence"
    )
    await make_valid(
        registrar, producer, job, f"{job}-late", 310, attempt=1, expect=CheckpointState.FENCED
    )
    await waiter(settings)("checkpoint.fenced", job, checkpoint_id=f"{job}-late")
    assert len(await coordinator.pins.pins(job)) == 2
    await make_valid(registrar, producer, job, f"{job}-c4", 400, attempt=2)

    async def unpinned() -> bool:
        return not await coordinator.pins.pins(job)

    await wait_for(unpinned, what="pins removed")


async def test_closure_deletes_the_failed_attempts_partial_checkpoint(
    coordinator: RestoreCoordinator,
    coord_settings: RestoreCoordinatorSettings,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    job = "job-close"
    wait = waiter(settings)
    root = Path(coord_settings.storage_root)
    store = FsStore(root)
    store.put(f"{job}/step-400/shard-0.bin", b"partial")
    store.put(f"{job}/step-400/shard-1.bin", b"partial")
    partial = store.uri(f"{job}/step-400")
    await three_checkpoints(registrar, producer, job)
    await producer.publish(
        build(
            CheckpointWritingV1(
                job_id=job, checkpoint_id=f"{job}-partial", uri=partial, run_id="run-1", step=400
            ),
            source="test/watcher",
            time=NOW + timedelta(seconds=120),
            key="w",
        )
    )

    async def partial_recorded() -> bool:
        return await registrar.registry.get(f"{job}-partial") is not None

    await wait_for(partial_recorded, what="the partial write in the registry")
    await producer.publish(started(job))
    await producer.publish(progress(job, 300))
    await producer.publish(progress(job, 301))
    await settled(settings, "started", "progress")
    await producer.publish(failed(job))
    [plan] = await wait("resume.planned", job)
    await producer.publish(started(job, 2, plan_id=plan["plan_id"]))
    await producer.publish(progress(job, 301, attempt=2, plan_id=plan["plan_id"]))
    await wait("resume.verified", job)
    [closed] = await wait("resume.closed", job)
    assert closed["cleaned"] == [partial]
    assert closed["unreclaimable"] == []
    assert list(store.list(f"{job}/step-400/")) == []
    assert store.exists(f"{job}/step-400/shard-0.bin") is False
    # R6: the record whose bytes went ends deleted, with the coordinator's tombstone.
    tombstone = await deleted_record(registrar, f"{job}-partial")
    assert (tombstone.actor, tombstone.objects_deleted) == ("restore-coordinator", 2)
    assert f"resume plan {plan['plan_id']}" in tombstone.reason
    # The watcher sees the folder gone and reports the write failed: too late, a no-op.
    gone = CheckpointWriteFailedV1(
        job_id=job, checkpoint_id=f"{job}-partial", uri=partial, reason="folder removed"
    )
    await producer.publish(build(gone, source="test/watcher", time=NOW, key="gone"))
    await wait_for(
        lambda: consumer_idle(settings, "registrar--checkpoints"), what="the registrar idle"
    )
    after = await registrar.registry.get(f"{job}-partial")
    assert after is not None
    assert (after.state, after.tombstone) == (CheckpointState.DELETED, tombstone)
    letters = await stream_messages(settings.nats_url, settings.dead_letter_stream)
    assert [m for m in letters if f"{job}-partial".encode() in m.data] == []


async def deleted_record(registrar: Registrar, checkpoint_id: str) -> Tombstone:
    async def gone() -> Tombstone | None:
        rec = await registrar.registry.get(checkpoint_id)
        if rec is None or rec.state is not CheckpointState.DELETED:
            return None
        return rec.tombstone

    return await wait_for(gone, what=f"{checkpoint_id} deleted with a tombstone")


async def test_closure_never_deletes_the_bytes_of_a_live_checkpoint(
    coordinator: RestoreCoordinator,
    coord_settings: RestoreCoordinatorSettings,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    """Two partial writes of the failed attempt: one holds a live checkpoint's folder inside
    it (its own files go, that folder stays), the other is at the same location as a live
    checkpoint (nothing goes: its bytes cannot be told apart; a human is told)."""
    job = "job-share"
    wait = waiter(settings)
    store = FsStore(Path(coord_settings.storage_root))
    for folder in (f"{job}/step-400", f"{job}/step-400/inner", f"{job}/step-500"):
        store.put(f"{folder}/shard-0.bin", b"bytes of " + folder.encode())
    await three_checkpoints(registrar, producer, job)
    await make_valid(registrar, producer, job, "inner", 50, folder=f"{job}/step-400/inner")
    await make_valid(registrar, producer, job, "same", 60, folder=f"{job}/step-500")
    for n, step in enumerate((400, 500)):
        writing = CheckpointWritingV1(
            job_id=job, checkpoint_id=f"{job}-partial-{step}", uri=store.uri(f"{job}/step-{step}"),
            run_id="run-1", step=step,
        )  # fmt: skip
        await producer.publish(
            build(writing, source="test/watcher", time=NOW + timedelta(seconds=120), key=f"w{n}")
        )
    for step in (400, 500):
        await wait_for(
            lambda s=step: registrar.registry.get(f"{job}-partial-{s}"), what=f"partial {step}"
        )
    kept = {k: store.read_bytes(k) for k in (f"{job}/step-400/inner/shard-0.bin",
                                               f"{job}/step-500/shard-0.bin")}  # fmt: skip
    await producer.publish(started(job))
    await producer.publish(progress(job, 300))
    await producer.publish(progress(job, 301))
    await settled(settings, "started", "progress")
    await producer.publish(failed(job))
    [plan] = await wait("resume.planned", job)
    await producer.publish(started(job, 2, plan_id=plan["plan_id"]))
    await producer.publish(progress(job, 301, attempt=2, plan_id=plan["plan_id"]))
    [closed] = await wait("resume.closed", job)
    [cleaned] = closed["cleaned"]
    assert cleaned.startswith(store.uri(f"{job}/step-400"))
    assert f"{job}/step-400/inner (checkpoint inner)" in cleaned
    [left] = closed["unreclaimable"]
    assert left.startswith(store.uri(f"{job}/step-500"))
    assert "live checkpoint same is at the same location" in left
    assert not store.exists(f"{job}/step-400/shard-0.bin")
    assert {k: store.read_bytes(k) for k in kept} == kept
    for ckpt in ("inner", "same"):
        found = await registrar.registry.get(ckpt)
        assert found is not None
        assert found.state is CheckpointState.VALID
    # The partial write whose own files went is tombstoned, saying what was kept; the one
    # nothing of which could go stays a partial write (a human reclaims it).
    tombstone = await deleted_record(registrar, f"{job}-partial-400")
    assert tombstone.objects_deleted == 1
    assert "(checkpoint inner)" in tombstone.reason
    untouched = await registrar.registry.get(f"{job}-partial-500")
    assert untouched is not None
    assert untouched.state is CheckpointState.WRITING


async def test_burst_of_failures_plans_each_once_across_two_replicas(
    coordinator: RestoreCoordinator,
    coord_settings: RestoreCoordinatorSettings,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    """A rack lost: many jobs fail at once, each failure delivered twice (a scheduler's copy),
    to two replicas taking fetched batches. Every job gets exactly one plan, stored once, and
    every failure's copies are settled (none left pending or dead-lettered)."""
    second = await _start(coord_settings)
    try:
        jobs = [f"job-burst-{i}" for i in range(12)]
        for job in jobs:
            await make_valid(registrar, producer, job, f"{job}-c1", 100)
            await producer.publish(started(job))
        await settled(settings, "started")
        burst = [failed(job, key=f"copy{copy}") for copy in range(2) for job in jobs]
        for event in burst:
            await producer.publish(event)
        for job in jobs:
            await waiter(settings)("resume.planned", job)
        await settled(settings, "failed")
        plans = [p for p in await events_of(settings, "resume.planned") if p["job_id"] in jobs]
        assert sorted(p["job_id"] for p in plans) == sorted(jobs)
        assert {p["checkpoint_id"] for p in plans} == {f"{job}-c1" for job in jobs}
        for job in jobs:
            stored = await coordinator.state.decision(job, 1)
            assert stored is not None
            assert stored.published
            [planned] = [p for p in plans if p["job_id"] == job]
            assert planned["plan_id"] in "".join(stored.events)
        assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []
    finally:
        await _stop(second)


def taken_over(job: str, plan_id: str, world_size: int) -> Envelope[EventData]:
    """Attempt 2's start, carrying out ``plan_id`` on ``world_size`` ranks (a takeover)."""
    return _ev(
        JobStartedV1(
            job_id=job, run_id="run-1", attempt=2, policy=JobPolicy(), environment=ENV,
            topology=Topology(world_size=world_size), code_version="abc", plan_id=plan_id,
        ),
        key=f"started-2-{world_size}",
        time=NOW + timedelta(seconds=200),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "outcome"),
    [(CheckpointFormat.NATIVE, "restated"), (CheckpointFormat.SAFETENSORS, "escalated")],
)
async def test_a_plan_is_restated_for_the_attempt_that_loads_it_on_another_world_size(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
    fmt: CheckpointFormat,
    outcome: str,
) -> None:
    """Issue 28: the plan is decided against the failed attempt (2 ranks: exact); attempt 2
    starts on 1 rank. A whole-state checkpoint is re-stated for it (same plan id, compatible,
    the reason says the world size changed); per-rank parts of a format that cannot reshard
    stop it (escalated, with the next step). The stored decision is the re-statement."""
    job = f"job-reshape-{fmt.value}"
    await make_valid(registrar, producer, job, f"{job}-c1", 100, fmt=fmt)
    await producer.publish(started(job))
    await producer.publish(progress(job, 100))
    await settled(settings, "started", "progress")
    await producer.publish(failed(job))
    wait = waiter(settings)
    [plan] = await wait("resume.planned", job)
    assert (plan["mode"], plan["compatibility"]) == ("exact_resume", "identical")
    await producer.publish(taken_over(job, plan["plan_id"], 2))  # the same shape: nothing
    await settled(settings, "started")
    assert [d for d in await events_of(settings, "resume.planned") if d["job_id"] == job] == [plan]
    await producer.publish(taken_over(job, plan["plan_id"], 1))
    if outcome == "restated":
        first, restated = await wait("resume.planned", job, 2)
        assert first == plan
        assert restated["plan_id"] == plan["plan_id"]
        assert (restated["mode"], restated["compatibility"]) == (
            "compatible_resume", "declared_compatible",
        )  # fmt: skip
        assert restated["reasons"][0].startswith("re-planned for attempt 2")
        assert any("world size 2→1" in r for r in restated["reasons"])
        assert any("data position at world size 1" in r for r in restated["reasons"])
    else:
        [stop] = await wait("resume.escalated", job)
        assert (stop["plan_id"], stop["attempt"]) == (plan["plan_id"], 1)
        assert stop["reason"] == "compatibility_unknown"
        assert "relaunch at world size 2" in stop["detail"]
    decision = await coordinator.state.decision(job, 1)
    assert decision is not None
    assert decision.published
    assert ("compatible_resume" if outcome == "restated" else "compatibility_unknown") in (
        decision.events[0]
    )
    # The same start published again (the stream drops the duplicate) restates nothing more.
    await producer.publish(taken_over(job, plan["plan_id"], 1))
    await settled(settings, "started")
    kinds = [
        *await events_of(settings, "resume.planned"),
        *await events_of(settings, "resume.escalated"),
    ]
    assert len([d for d in kinds if d["job_id"] == job]) == 2


async def test_a_primary_failing_at_load_is_restored_from_its_copy_then_falls_back(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    """Issue 29: the newest checkpoint's primary fails to load. The next plan restores the SAME
    checkpoint from its verified copy (the plan says which and why), the primary quarantined;
    only when that copy fails to load too is the older checkpoint planned."""
    job = "job-copyload"
    wait = waiter(settings)
    await three_checkpoints(registrar, producer, job)
    newest = await registrar.registry.get(f"{job}-c3")
    assert newest is not None
    registrar.store.put(f"{job}/step-300/shard-0.bin", b"bytes")  # the primary is there
    copy = f"s3://copies/{job}/step-300"
    await producer.publish(
        build(
            CheckpointCopyChangedV1(
                job_id=job, checkpoint_id=newest.checkpoint_id, uri=newest.uri, copy_uri=copy,
                copy_state=CopyState.VALID, reason="verified", tier="critical",
            ),
            source="test/checker",
            time=CKPT_T + timedelta(seconds=400),
            key="copy",
        )
    )  # fmt: skip

    async def copied() -> bool:
        rec = await registrar.registry.get(newest.checkpoint_id)
        return rec is not None and copy in rec.copies

    await wait_for(copied, what="the copy recorded")
    await producer.publish(started(job))
    await producer.publish(failed(job))
    [first] = await wait("resume.planned", job)
    assert (first["checkpoint_id"], first["checkpoint_uri"]) == (newest.checkpoint_id, newest.uri)

    def load_failed(plan: dict[str, Any], attempt: int) -> Envelope[EventData]:
        data = ResumeLoadFailedV2(
            job_id=job, plan_id=plan["plan_id"], run_id="run-1",
            checkpoint_id=plan["checkpoint_id"], reason=f"checksum mismatch ({attempt})",
            side=FailureSide.JOB, blame=LoadBlame.CHECKPOINT,
        )  # fmt: skip
        return _ev(data, key=f"lf-{attempt}")

    await producer.publish(started(job, 2, plan_id=first["plan_id"]))
    await producer.publish(load_failed(first, 2))
    await producer.publish(failed(job, 2, plan_id=first["plan_id"]))
    [second] = await wait("resume.planned", job, attempt=3)
    assert (second["checkpoint_id"], second["checkpoint_uri"]) == (newest.checkpoint_id, copy)
    assert second["fallback_from"] == newest.checkpoint_id
    assert second["reasons"][0] == (
        f"primary {newest.uri} failed to load (excluded after a load failure): restoring from "
        f"its verified copy {copy}"
    )
    [q] = await wait("checkpoint.quarantined", job)
    assert q["uri"] == newest.uri
    assert not registrar.store.exists(f"{job}/step-300/shard-0.bin")  # moved aside

    await producer.publish(started(job, 3, plan_id=second["plan_id"]))
    await producer.publish(load_failed(second, 3))
    await producer.publish(failed(job, 3, plan_id=second["plan_id"]))
    [third] = await wait("resume.planned", job, attempt=4)
    assert third["checkpoint_id"] == f"{job}-c2"
    assert third["fallback_from"] == newest.checkpoint_id
    await settled(settings, "failed", "load-failed")
    assert len(await wait("checkpoint.quarantined", job)) == 1  # the copy's failure moved nothing
    assert len([p for p in await events_of(settings, "resume.planned") if p["job_id"] == job]) == 3
