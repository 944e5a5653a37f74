"""Progress and heartbeats in their own stream, under limits, against a real nats-server: where
each event lands, the per-job limit, the migration of an event stream that still captures them
(and the durable it made obsolete, retired), and the merged read back (`iter_history`)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.js.api import ConsumerConfig

from ckpt_ha.bus import obsolete, streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG, Envelope, EventData, build
from ckpt_ha.contracts.job import JobHeartbeatV1, JobProgressV1, JobStartedV2
from ckpt_ha.contracts.subjects import telemetry_filters
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import stream_messages
from tests.support.events import T0

pytestmark = pytest.mark.integration


def progress(job: str, step: int, at: int) -> Envelope[EventData]:
    data = JobProgressV1(job_id=job, run_id="r1", step=step)
    return build(data, source="test", time=T0 + timedelta(seconds=at), key=f"{job}|{step}")


def heartbeat(job: str, seq: int, at: int) -> Envelope[EventData]:
    data = JobHeartbeatV1(job_id=job, run_id="r1", sequence=seq)
    return build(data, source="test", time=T0 + timedelta(seconds=at), key=f"{job}|hb{seq}")


def started(job: str, at: int) -> Envelope[EventData]:
    data = JobStartedV2(job_id=job, run_id="r1", heartbeat_s=10)
    return build(data, source="test", time=T0 + timedelta(seconds=at), key=f"{job}|start")


def subjects(msgs: list[nats.aio.msg.Msg]) -> list[str]:
    return [m.subject.split(".")[3] for m in msgs]


async def test_reports_go_to_the_progress_stream_and_decisions_to_the_event_stream(
    settings: ServiceSettings, producer: Bus
) -> None:
    for event in (started("j1", 0), progress("j1", 10, 1), heartbeat("j1", 1, 2)):
        await producer.publish(event)
    assert subjects(await stream_messages(settings.nats_url, settings.events_stream)) == ["started"]
    assert subjects(await stream_messages(settings.nats_url, settings.progress_stream)) == [
        "progress",
        "heartbeat",
    ]


async def test_the_progress_stream_keeps_the_newest_reports_of_each_job(
    settings: ServiceSettings,
) -> None:
    cfg = dataclasses.replace(settings.bus(), progress_per_job=3)
    nc = await nats.connect(settings.nats_url)
    try:
        assert any("updated" in line for line in await streams.provision(nc.jetstream(), cfg))
    finally:
        await nc.close()
    bus = Bus(cfg, "test-producer")
    await bus.broker.start()
    try:
        for step in range(1, 8):
            await bus.publish(progress("busy", step, step))
        await bus.publish(progress("quiet", 1, 1))
    finally:
        await bus.broker.stop()
    kept = await stream_messages(settings.nats_url, settings.progress_stream)
    steps = [(m.subject.rsplit(".", 1)[1], json.loads(m.data)["data"]["step"]) for m in kept]
    assert steps == [("busy", 5), ("busy", 6), ("busy", 7), ("quiet", 1)]


async def test_provision_migrates_an_event_stream_that_still_captures_reports(
    settings: ServiceSettings,
) -> None:
    """An older release's layout: one stream for every event, reports included. `check` refuses
    it; `provision` narrows the event stream (the reports already in it stay) and creates the
    progress stream; new reports go there."""
    legacy = dataclasses.replace(settings.bus(), progress_stream="")
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    try:
        for name in (settings.events_stream, settings.progress_stream):
            await js.delete_stream(name)
        await streams.provision(js, legacy)
        old = Bus(legacy, "test-old")
        # An older coordinator's durable on the reports, in the event stream.
        old.consumer("progress", telemetry_filters(legacy.prefix)[1])(_ignore)
        await old.broker.start()
        try:
            await old.publish(started("j1", 0))
            await old.publish(progress("j1", 1, 1))
        finally:
            await old.broker.stop()
        assert old.consumers == {"test-old--progress": settings.events_stream}
        with pytest.raises(streams.StreamMisconfigured, match=r"need .*job\.started"):
            await streams.check(js, settings.bus())
        # Someone else's consumer on the same subject: never ckpt-ha's to remove.
        await js.add_consumer(
            settings.events_stream,
            ConsumerConfig(
                durable_name="someone", filter_subject=telemetry_filters(legacy.prefix)[1]
            ),
        )
        done = await streams.provision(js, settings.bus())
        assert done[0].startswith(f"{settings.events_stream}: updated")
        assert done[2] == f"{settings.progress_stream}: created"
        await streams.check(js, settings.bus())
        await streams.require_complete(js, settings.bus())
        # The durable the narrowing made obsolete: listed, kept within the grace, then removed.
        now = datetime.now(UTC)
        [kept] = await obsolete.retire(js, settings.bus(), ["test-old"], grace_s=3600, now=now)
        assert kept.startswith(f"{settings.events_stream}: consumer test-old--progress on ")
        assert "kept until idle for 3600s" in kept
        later = now + timedelta(hours=2)
        [gone] = await obsolete.retire(js, settings.bus(), ["test-old"], grace_s=3600, now=later)
        assert gone.endswith(": removed"), gone
        names = {c.name for c in await js.consumers_info(settings.events_stream)}
        assert names == {"someone"}
        assert await obsolete.retire(js, settings.bus(), ["test-old"], grace_s=0, now=later) == []
    finally:
        await nc.close()
    new = Bus(settings.bus(), "test-new")
    await new.broker.start()
    try:
        await new.publish(progress("j1", 2, 2))
        await new.publish(started("j2", 3))
    finally:
        await new.broker.stop()
    in_events = subjects(await stream_messages(settings.nats_url, settings.events_stream))
    assert in_events == ["started", "progress", "started"]
    in_progress = subjects(await stream_messages(settings.nats_url, settings.progress_stream))
    assert in_progress == ["progress"]


async def test_a_report_lands_in_whichever_stream_captures_it(settings: ServiceSettings) -> None:
    """A runner configured for the old layout, still running while the operator migrates:
    its heartbeats are not pinned to the event stream, so they land in the progress stream."""
    legacy = dataclasses.replace(settings.bus(), progress_stream="")
    runner = Bus(legacy, "test-runner")
    nc = await nats.connect(settings.nats_url)
    try:
        await nc.jetstream().delete_stream(settings.progress_stream)
        await nc.jetstream().delete_stream(settings.events_stream)
        await streams.provision(nc.jetstream(), legacy)
        await runner.broker.start()
        await runner.publish(heartbeat("j1", 1, 1))
        await streams.provision(nc.jetstream(), settings.bus())  # the operator migrates
        await runner.publish(heartbeat("j1", 2, 2))
        await runner.publish(started("j2", 3))
    finally:
        await runner.broker.stop()
        await nc.close()
    in_events = subjects(await stream_messages(settings.nats_url, settings.events_stream))
    assert in_events == ["heartbeat", "started"]
    in_progress = subjects(await stream_messages(settings.nats_url, settings.progress_stream))
    assert in_progress == ["heartbeat"]


async def _ignore(event: Envelope[EventData]) -> None:
    del event


async def test_a_service_refuses_a_deployment_without_the_progress_stream(
    settings: ServiceSettings,
) -> None:
    nc = await nats.connect(settings.nats_url)
    try:
        await nc.jetstream().delete_stream(settings.progress_stream)
        with pytest.raises(streams.StreamMisconfigured, match="does not exist"):
            await streams.check(nc.jetstream(), settings.bus())
    finally:
        await nc.close()


async def test_the_progress_stream_limits_are_the_operators_to_tune(
    settings: ServiceSettings,
) -> None:
    """A service started without the operator's CKPT_HA_PROGRESS_* accepts the stream; the
    operator's next `provision` with other limits applies them."""
    tuned = dataclasses.replace(settings.bus(), progress_max_age_s=3600.0, progress_per_job=10)
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    try:
        done = await streams.provision(js, tuned)
        assert "max_age" in done[2], done
        assert "max_msgs_per_subject" in done[2], done
        await streams.check(js, settings.bus())  # the service's defaults differ: still accepted
        info = await js.stream_info(settings.progress_stream)
        assert (info.config.max_age, info.config.max_msgs_per_subject) == (3600.0, 10)
    finally:
        await nc.close()


async def test_a_read_back_merges_the_reports_with_the_events_by_time(
    settings: ServiceSettings, producer: Bus
) -> None:
    # Published out of time order across the two streams; each stream in its own order.
    await producer.publish(progress("j1", 5, 5))
    await producer.publish(started("j1", 0))
    await producer.publish(heartbeat("j1", 1, 7))
    await producer.publish(started("j2", 6))
    cfg = settings.bus()
    job_filter = f"{cfg.prefix}.ev.*.*.*.j1"
    events, read = await read_events(cfg, CATALOG, job_filter, idle_timeout=2.0)
    assert [(e.event_type, e.data.job_id) for e in events] == [
        ("job.started", "j1"),
        ("job.progress", "j1"),
        ("job.heartbeat", "j1"),
    ]
    assert read == 3
    everything, _ = await read_events(cfg, CATALOG, f"{cfg.prefix}.ev.>", idle_timeout=2.0)
    assert [e.time for e in everything] == sorted(e.time for e in everything)
    decisions, _ = await read_events(cfg, CATALOG, f"{cfg.prefix}.ev.job.started.*.*")
    assert [e.data.job_id for e in decisions] == ["j1", "j2"]
