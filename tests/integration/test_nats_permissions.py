"""deploy/nats: the committed config is valid, matches the table, and really confines services."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from pydantic import SecretStr

from ckpt_ha.bus import obsolete, streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.permissions import (
    EVENTS_STREAM,
    PRINCIPALS,
    PROGRESS_STREAM,
    main,
    render,
    users,
)
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.bus.streams import StreamMisconfigured
from ckpt_ha.cli.serve import entries
from ckpt_ha.contracts import CATALOG
from ckpt_ha.contracts.subjects import event_subject, inbox_prefix
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registrar.app import Registrar, build
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import job_key, stream_messages, wait_for
from tests.support.events import committed, verified

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"


def test_committed_permissions_match_the_table() -> None:
    assert main(["--check"]) == 0, "run: python -m ckpt_ha.bus.permissions"


def test_every_consumer_of_every_service_is_permitted() -> None:
    permitted = {
        pair
        for p in PRINCIPALS
        for pair in p.durable_streams(EVENTS_STREAM, PROGRESS_STREAM).items()
    }
    for entry in entries().values():
        svc = entry.build(entry.settings.model_construct())
        assert set(svc.bus.consumers.items()) <= permitted, entry.name
        assert any(p.user == entry.name for p in PRINCIPALS), entry.name


@pytest.fixture
def secured_nats(tmp_path: Path, settings: ServiceSettings) -> Iterator[procs.ManagedProcess]:
    conf = render(
        password=lambda user: json.dumps(f"pw-{user}"),
        prefix=settings.subject_prefix,
        events_stream=settings.events_stream,
        dlq_stream=settings.dead_letter_stream,
        progress_stream=settings.progress_stream,
    )
    proc = procs.start_nats(tmp_path, config_extra=conf)

    async def provision() -> None:  # the operator's step, before any service starts
        nc = await nats_as(proc, "operator")
        await streams.provision(nc.jetstream(), settings.bus())
        # Its look for obsolete durables lists every stream's consumers: allowed, none found.
        now = datetime.now(UTC)
        assert (
            await obsolete.retire(nc.jetstream(), settings.bus(), users(), grace_s=0, now=now) == []
        )
        await nc.close()

    try:
        asyncio.run(provision())
        yield proc
    finally:
        procs.stop(proc)


def as_user(settings: ServiceSettings, url: str, user: str) -> ServiceSettings:
    return settings.model_copy(
        update={"nats_url": url, "nats_user": user, "nats_password": SecretStr(f"pw-{user}")}
    )


@pytest.fixture
async def confined_registrar(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess, tmp_path: Path
) -> AsyncIterator[Registrar]:
    """The registrar as its own user; its storage root is the test's (a location must be its
    job's there)."""
    s = as_user(settings, secured_nats.url, "registrar")
    svc = build(
        RegistrarSettings.model_validate(
            {**s.model_dump(), "nats_password": "pw-registrar", "storage_root": str(tmp_path)}
        )
    )
    await svc.bus.broker.start()
    yield svc
    await svc.bus.broker.stop()
    await svc.registry.close()


async def test_services_work_within_their_permissions_and_not_beyond(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess, confined_registrar: Registrar
) -> None:
    watcher = Bus(as_user(settings, secured_nats.url, "writer-watcher").bus(), "writer-watcher")
    checker = Bus(
        as_user(settings, secured_nats.url, "integrity-checker").bus(), "integrity-checker"
    )
    await watcher.broker.start()
    await checker.broker.start()
    try:
        await watcher.publish(committed("p1", uri=confined_registrar.store.uri("job-1/s-1")))
        await checker.publish(verified("p1"))

        async def valid() -> bool:
            rec = await confined_registrar.registry.get("p1")
            return rec is not None and rec.state.value == "valid"

        await wait_for(valid, what="valid under confined users")

        # The registrar announced `registered` under its own user ...
        async def registered() -> bool:
            msgs = await stream_messages_as(secured_nats.url, settings.events_stream)
            return any(b"checkpoint.registered" in m for m in msgs)

        await wait_for(registered, what="checkpoint.registered")

        # ... but a watcher cannot claim integrity evidence it does not own.
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await watcher.publish(verified("p2"))
        subject = event_subject(settings.subject_prefix, "checkpoint.verified", 1, "job-1")
        assert subject.startswith(settings.subject_prefix)
    finally:
        await watcher.broker.stop()
        await checker.broker.stop()
    assert not any(
        b'"p2"' in m for m in await stream_messages_as(secured_nats.url, settings.events_stream)
    )
    # The operator reads the stream back (rebuild, audits) through an ordered consumer, whose
    # messages arrive under its own inbox.
    operator = as_user(settings, secured_nats.url, "operator").bus()
    events, _ = await read_events(operator, CATALOG, f"{operator.prefix}.ev.>", idle_timeout=2)
    assert {e.event_type for e in events} >= {"checkpoint.committed", "checkpoint.verified"}


async def stream_messages_as(url: str, stream: str) -> list[bytes]:
    host = url.removeprefix("nats://")
    msgs = await stream_messages(f"nats://operator:pw-operator@{host}", stream)
    return [m.data for m in msgs]


async def test_wrong_password_is_refused(secured_nats: procs.ManagedProcess) -> None:
    host = secured_nats.url.removeprefix("nats://")
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            f"nats://registrar:wrong@{host}",
            connect_timeout=2,
            max_reconnect_attempts=0,
            allow_reconnect=False,
        )


async def test_the_sdk_announces_as_the_job_user(
    settings: ServiceSettings,
    secured_nats: procs.ManagedProcess,
    confined_registrar: Registrar,
    tmp_path: Path,
) -> None:
    from ckpt_ha import sdk

    bus = sdk.BusEndpoint(
        secured_nats.url,
        prefix=settings.subject_prefix,
        user="job",
        password=SecretStr("pw-job"),
        job_key=job_key("job-r"),
    )
    saved = await asyncio.to_thread(
        sdk.save, str(tmp_path), "job-r", 1, {"w": b"x" * 10}, run_id="r", bus=bus
    )
    assert (saved.announced_writing, saved.announced) == (True, True)

    async def both() -> list[str]:
        rec = await confined_registrar.registry.get(saved.checkpoint_id)
        states = [h.state.value for h in rec.history] if rec is not None else []
        return states if len(states) >= 2 else []

    history = await wait_for(both, what="the job's announcements in the registry")
    assert history == ["writing", "pending_verification"]


async def nats_as(proc: procs.ManagedProcess, user: str) -> nats.aio.client.Client:
    host = proc.url.removeprefix("nats://")
    return await nats.connect(
        f"nats://{user}:pw-{user}@{host}",
        inbox_prefix=inbox_prefix(user),
        max_reconnect_attempts=0,
        allow_reconnect=False,
    )


@pytest.mark.parametrize("user", ["job", "runner", "registrar", "retention-janitor"])
async def test_no_job_or_service_principal_may_change_or_purge_a_stream(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess, user: str
) -> None:
    """``max_msgs=1`` amounts to a purge: a job's or a service's credentials can do neither."""
    nc = await nats_as(secured_nats, user)
    js = nc.jetstream(timeout=1)
    try:
        info = await js.stream_info(settings.events_stream)  # reading the config is allowed
        assert info.config.deny_purge
        assert info.config.deny_delete
        changed = dataclasses.replace(info.config, max_msgs=1)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.update_stream(changed)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.purge_stream(settings.events_stream)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.delete_stream(settings.events_stream)
    finally:
        await nc.close()
    ops = await nats_as(secured_nats, "operator")
    try:
        info = await ops.jetstream().stream_info(settings.events_stream)
        assert (info.config.max_msgs, info.config.deny_purge) == (-1, True)
        # Not even the operator purges: the permission is not granted and the stream denies it.
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await ops.jetstream(timeout=1).purge_stream(settings.events_stream)
    finally:
        await ops.close()


@pytest.mark.parametrize(
    "event_type", ["checkpoint.verified", "checkpoint.expired", "checkpoint.deleted",
                   "checkpoint.pinned", "checkpoint.registered", "resume.planned", "job.failed"]
)  # fmt: skip
async def test_a_job_cannot_publish_what_services_or_operators_decide(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess, event_type: str
) -> None:
    nc = await nats_as(secured_nats, "job")
    try:
        subject = event_subject(settings.subject_prefix, event_type, 1, "job-x")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await nc.jetstream().publish(subject, b"{}", timeout=1)
    finally:
        await nc.close()


async def test_a_job_sees_no_other_jobs_events(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess, confined_registrar: Registrar
) -> None:
    """Plans and commits name checkpoints: the ``job`` principal may subscribe to nothing but
    its own replies. Not to another job's subjects, and not to the inboxes the services fetch
    events into (all users share one account, so NATS's shared ``_INBOX.>`` would carry
    every event the registrar fetches)."""
    errors: list[Exception] = []
    seen: list[bytes] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    async def sniff(msg: nats.aio.msg.Msg) -> None:
        seen.append(msg.data)

    host = secured_nats.url.removeprefix("nats://")
    nc = await nats.connect(
        f"nats://job:pw-job@{host}", error_cb=on_error, max_reconnect_attempts=0
    )
    sniffed = [
        f"{settings.subject_prefix}.ev.resume.planned.*.*",
        "_INBOX.>",
        "_INBOX_registrar.>",
        ">",
    ]
    watcher = Bus(as_user(settings, secured_nats.url, "writer-watcher").bus(), "writer-watcher")
    await watcher.broker.start()
    try:
        for subject in sniffed:
            await nc.subscribe(subject, cb=sniff)
        await nc.flush()
        # Another job's checkpoint, fetched and registered by the registrar meanwhile.
        uri = confined_registrar.store.uri("victim/step-9")
        await watcher.publish(committed("victim-secret-id", job="victim", uri=uri))

        async def registered() -> bool:
            return await confined_registrar.registry.get("victim-secret-id") is not None

        await wait_for(registered, what="the victim's checkpoint registered")
        await nc.flush()
        assert [m for m in seen if b"victim-secret-id" in m] == []
        assert seen == []
        await wait_for(
            lambda: asyncio.sleep(0, len(errors) >= len(sniffed) or None),
            what="a permissions violation for each subscription",
        )
    finally:
        await watcher.broker.stop()
        await nc.close()
    assert all("permissions violation" in str(e).lower() for e in errors), errors


async def test_a_service_refuses_a_stream_it_did_not_provision_and_changes_nothing(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess
) -> None:
    ops = await nats_as(secured_nats, "operator")
    try:
        js = ops.jetstream()
        info = await js.stream_info(settings.events_stream)
        # NATS itself refuses to lift deny_purge / deny_delete once set ...
        with pytest.raises(nats.js.errors.ServerError, match="can not cancel deny purge"):
            await js.update_stream(dataclasses.replace(info.config, deny_purge=False))
        # ... but an age limit would drop old events: the registrar refuses such a stream.
        await js.update_stream(dataclasses.replace(info.config, max_age=3600))
        registrar = Bus(as_user(settings, secured_nats.url, "registrar").bus(), "registrar")
        with pytest.raises(StreamMisconfigured, match="max_age is 3600"):
            await registrar.broker.start()
        await registrar.broker.stop()
        assert (await js.stream_info(settings.events_stream)).config.max_age == 3600
    finally:
        await ops.close()


async def test_the_runner_and_its_job_work_as_the_runner_user(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess, tmp_path: Path
) -> None:
    """`ckpt-ha run` publishes job.* and follows its plans as ``runner``; the job's SDK reports
    progress as ``job``, the login the runner hands it; the coordinator's escalation reaches it."""
    import asyncio
    import dataclasses
    import io
    import sys
    from datetime import UTC, datetime

    from ckpt_ha.contracts import build
    from ckpt_ha.contracts.job import FailureCause, JobFailedV2
    from ckpt_ha.contracts.resume import ResumeEscalatedV2
    from ckpt_ha.runner.adapter import LocalProcess
    from ckpt_ha.runner.launch import RunSpec
    from ckpt_ha.runner.runner import EXIT_ESCALATED, Runner

    storage = tmp_path / "storage"
    storage.mkdir()
    spec = RunSpec(
        job_id="job-sec",
        run_id="run-sec",
        command=(
            sys.executable,
            "-m",
            "ckpt_ha.lab.examples.numpy_mlp",
            "--steps",
            "5",
            "--crash-at-step",
            "3",
        ),
        storage_root=str(storage),
        state_dir=tmp_path / "state",
        plan_timeout_s=30,
        heartbeat_s=0.1,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_HA_")}
    out = io.StringIO()
    runner = Runner(
        spec,
        as_user(settings, secured_nats.url, "runner").bus(),
        LocalProcess(stderr=io.BytesIO()),
        base_env=env,
        job_bus=as_user(settings, secured_nats.url, "job").bus(),
        out=out,
    )
    running = asyncio.create_task(runner.run())

    async def failed_and_progress() -> bool:
        msgs = await stream_messages_as(secured_nats.url, settings.events_stream)
        reports = await stream_messages_as(secured_nats.url, settings.progress_stream)
        return any(b"job.failed" in m for m in msgs) and any(b"job.progress" in m for m in reports)

    await wait_for(failed_and_progress, timeout=30, what="job.failed and the SDK's job.progress")
    coordinator = Bus(
        as_user(settings, secured_nats.url, "restore-coordinator").bus(), "restore-coordinator"
    )
    await coordinator.broker.start()
    try:
        escalated = ResumeEscalatedV2(
            job_id="job-sec", plan_id="p-sec", reason="restart loop", next_step="runbook step 9",
            attempt=1,
        )  # fmt: skip
        now = datetime.now(UTC)
        # Pipelined, as a burst's decisions are (`Bus.publish_many`): its acks come back to
        # the coordinator's own inbox.
        decision = build(escalated, source="test", time=now, key="p-sec")
        assert await coordinator.publish_many([decision]) == [None]
        # The coordinator may declare an attempt lost (job.failed, signed with the job's key).
        lost = JobFailedV2(job_id="job-sec", run_id="run-sec", attempt=9, cause=FailureCause.LOST)
        await coordinator.publish(build(lost, source="test", time=now, key="lost"))
    finally:
        await coordinator.broker.stop()
    assert await asyncio.wait_for(running, timeout=30) == EXIT_ESCALATED
    assert "escalated: restart loop" in out.getvalue()
    msgs = await stream_messages_as(secured_nats.url, settings.events_stream)
    reports = await stream_messages_as(secured_nats.url, settings.progress_stream)
    assert any(b"job.heartbeat" in m for m in reports)  # published as runner
    assert any(b'"lost"' in m for m in msgs)

    # A runner taking the run over finds the decision already on the stream (STREAM.MSG.GET).
    again = io.StringIO()
    resumed = Runner(
        dataclasses.replace(spec, resume=True),
        as_user(settings, secured_nats.url, "runner").bus(),
        LocalProcess(stderr=io.BytesIO()),
        base_env=env,
        out=again,
    )
    assert await asyncio.wait_for(resumed.run(), timeout=30) == EXIT_ESCALATED
    assert "cannot read earlier plans" not in again.getvalue()
    assert "escalated: restart loop" in again.getvalue()


async def test_the_viewer_reads_state_and_stored_messages_and_changes_nothing(
    settings: ServiceSettings, secured_nats: procs.ManagedProcess
) -> None:
    """On-call triage as ``viewer``: streams, consumers and stored messages (what `ckpt-ha
    status` and `dead-letters` read); never an event, a consumer or a stream changed."""
    ops = await nats_as(secured_nats, "operator")
    try:
        subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-1")
        await ops.jetstream().publish(subject, b"{}")
    finally:
        await ops.close()
    registrar = await nats_as(secured_nats, "registrar")  # its durable, as it makes it
    try:
        await registrar.jetstream().add_consumer(
            settings.events_stream, durable_name="registrar--checkpoints"
        )
    finally:
        await registrar.close()
    nc = await nats_as(secured_nats, "viewer")
    js = nc.jetstream(timeout=1)
    try:
        info = await js.stream_info(settings.events_stream)
        assert info.state.messages == 1
        assert (await js.get_msg(settings.events_stream, 1)).data == b"{}"
        durable = await js.consumer_info(settings.events_stream, "registrar--checkpoints")
        assert durable.num_pending == 1
        # Refused: publishing an event, creating or deleting a consumer, changing, purging or
        # deleting a stream, subscribing to the events.
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.publish(subject, b"{}")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.add_consumer(settings.events_stream, durable_name="viewer--x")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.delete_consumer(settings.events_stream, "registrar--checkpoints")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.update_stream(dataclasses.replace(info.config, max_msgs=1))
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.purge_stream(settings.events_stream)
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        watcher = await nats.connect(
            secured_nats.url.replace("nats://", "nats://viewer:pw-viewer@"),
            inbox_prefix=inbox_prefix("viewer"), error_cb=on_error, allow_reconnect=False,
        )  # fmt: skip
        await watcher.subscribe(f"{settings.subject_prefix}.>")
        await watcher.flush()
        await wait_for(lambda: asyncio.sleep(0, result=bool(errors)), what="a refusal")
        assert "permissions violation" in str(errors[0]).lower()
        await watcher.close()
    finally:
        await nc.close()
    ops = await nats_as(secured_nats, "operator")
    try:
        info = await ops.jetstream().stream_info(settings.events_stream)
        assert (info.state.messages, info.config.max_msgs) == (1, -1)
        names = await ops.jetstream().consumers_info(settings.events_stream)
        assert [c.name for c in names] == ["registrar--checkpoints"]
    finally:
        await ops.close()
