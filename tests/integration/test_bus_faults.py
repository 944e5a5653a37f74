"""Faults the bus must survive without losing anything: a Redis outage and silent handlers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registrar.app import Registrar, build
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.server import HttpEndpoint
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.telemetry import logs
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.events import committed

pytestmark = pytest.mark.integration


@pytest.fixture
async def registrar_on_private_redis(
    settings: ServiceSettings, private_redis: procs.ManagedProcess
) -> AsyncIterator[Registrar]:
    # Redis replies within 0.5 s or the handler fails; deliveries enough to outlast the freeze.
    s = RegistrarSettings.model_validate(
        {
            **settings.model_dump(),
            "redis_url": private_redis.url,
            "redis_timeout_s": 0.5,
            "max_deliver": 20,
            "backoff_s": (0.3,),
        }
    )
    svc = build(s)
    await svc.bus.broker.start()
    yield svc
    await svc.bus.broker.stop()
    await svc.registry.close()


async def test_redis_outage_naks_then_applies(
    settings: ServiceSettings,
    private_redis: procs.ManagedProcess,
    registrar_on_private_redis: Registrar,
    tmp_path: Path,
) -> None:
    """Redis frozen (SIGSTOP): the handler's Redis call times out and the event is nak'ed for a
    later delivery, not held; the health check and the gauge say Redis is down; after SIGCONT
    the event is applied, and nothing is dead-lettered."""
    svc = registrar_on_private_redis
    endpoint = HttpEndpoint(svc.metrics, svc.checks, "127.0.0.1", 0)
    producer = Bus(settings.bus(), "test-producer")
    await producer.broker.start()
    try:
        procs.pause(private_redis)  # Redis hangs: every apply times out
        await producer.publish(committed("during-outage"))

        async def naks() -> float:
            labels = {"service": "registrar", "consumer": "registrar--checkpoints"}
            found = svc.metrics.registry.get_sample_value(
                "ckpt_ha_messages_total", {**labels, "outcome": "nak"}
            )
            return found or 0.0

        await wait_for(naks, timeout=15, what="a nak while Redis is frozen")
        ok, checks = await endpoint.health()
        assert (ok, checks) == (False, {"redis": False})
        gauge = {"service": "registrar", "dependency": "redis"}
        assert svc.metrics.registry.get_sample_value("ckpt_ha_dependency_up", gauge) == 0
        # Not held: the message is back in the stream for a later delivery, not in flight.
        nc = await nats.connect(settings.nats_url)
        try:
            info = await nc.jetstream().consumer_info(
                settings.events_stream, "registrar--checkpoints"
            )
            assert info.num_redelivered > 0 or info.delivered.consumer_seq > 1
        finally:
            await nc.close()
        procs.resume(private_redis)
        assert await endpoint.health() == (True, {"redis": True})
        assert svc.metrics.registry.get_sample_value("ckpt_ha_dependency_up", gauge) == 1

        async def applied() -> bool:
            rec = await svc.registry.get("during-outage")
            return rec is not None and rec.state is CheckpointState.PENDING_VERIFICATION

        await wait_for(applied, timeout=30, what="the event applied after Redis is back")
        assert await stream_messages(settings.nats_url, settings.dead_letter_stream) == []
    finally:
        await producer.broker.stop()


async def test_max_deliveries_advisory_dead_letters_unanswered_messages(
    settings: ServiceSettings,
) -> None:
    """A handler that never answers (crashed, hung) still ends in the dead-letter stream."""
    bus = Bus(settings.bus(), "svc")
    durable = bus.durable_name("stuck")
    bus.consumers[durable] = settings.events_stream
    bus.watch_max_deliveries()
    await bus.broker.start()
    nc = await nats.connect(settings.nats_url)
    try:
        event = committed("unanswered")
        await bus.publish(event)
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"{settings.subject_prefix}.ev.>",
            durable=durable,
            stream=settings.events_stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=0.5, max_deliver=2),
        )
        for _ in range(2):  # take it twice and never answer
            [msg] = await sub.fetch(1, timeout=5)
            assert json.loads(msg.data)["id"] == event.id
            await asyncio.sleep(0.7)
        # The server notices the exhausted message when it next tries to deliver it.
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1)

        async def dead_letter() -> list[dict[str, str]]:
            msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
            return [dict(m.headers or {}, body=m.data.decode()) for m in msgs]

        [letter] = await wait_for(dead_letter, timeout=15, what="max-deliveries dead letter")
        assert letter["Ckpt-Error-Code"] == "max_deliver"
        assert letter["Ckpt-Consumer"] == durable
        assert json.loads(letter["body"])["id"] == event.id
    finally:
        await nc.close()
        await bus.broker.stop()


async def test_long_handlers_keep_their_message_with_in_progress_acks(
    settings: ServiceSettings,
) -> None:
    """A handler running several times ack_wait keeps its message: no other replica gets it."""
    cfg = settings.model_copy(update={"ack_wait_s": 1.0}).bus()
    bus = Bus(cfg, "slow")
    started, done = asyncio.Event(), asyncio.Event()

    @bus.consumer("work", f"{settings.subject_prefix}.ev.checkpoint.>")
    async def slow(event: Envelope[EventData]) -> None:
        started.set()
        await asyncio.sleep(3.5)
        done.set()

    await bus.broker.start()
    nc = await nats.connect(settings.nats_url)
    try:
        await bus.publish(committed("slow-1"))
        await asyncio.wait_for(started.wait(), timeout=10)
        # A second replica of the same durable consumer asks for work past ack_wait.
        replica = await nc.jetstream().pull_subscribe_bind(
            "slow--work", stream=settings.events_stream
        )
        with pytest.raises(nats.errors.TimeoutError):
            await replica.fetch(1, timeout=2.5)
        await asyncio.wait_for(done.wait(), timeout=10)

        async def acked() -> bool:
            info = await nc.jetstream().consumer_info(settings.events_stream, "slow--work")
            return info.num_ack_pending == 0 and info.num_redelivered == 0

        await wait_for(acked, what="the slow message acked once")
    finally:
        await nc.close()
        await bus.broker.stop()


async def test_what_a_handler_logs_names_its_event_s_job_and_checkpoint(
    settings: ServiceSettings,
) -> None:
    """Every line logged while a consumer handles an event (and while its batch about one job
    is handled) carries that event's ``job_id`` / ``checkpoint_id`` in the JSON format, through
    the real broker; a line logged between messages carries neither."""
    bus = Bus(settings.bus(), "logged")
    formatter = logs.formatter({"CKPT_HA_LOG_FORMAT": "json"})
    lines: list[dict[str, Any]] = []
    seen = asyncio.Event()

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "ckpt_ha.test.scope":
                lines.append(json.loads(formatter.format(record)))
                if len(lines) >= 2:
                    seen.set()

    logger = logging.getLogger("ckpt_ha.test.scope")
    capture = Capture()
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)

    @bus.consumer("one", f"{settings.subject_prefix}.ev.checkpoint.committed.>")
    async def one(event: Envelope[EventData]) -> None:
        logger.info("one message")

    @bus.batch_consumer("many", f"{settings.subject_prefix}.ev.checkpoint.committed.>")
    async def many(events: list[Envelope[EventData]]) -> list[BaseException | None]:
        logger.info("a batch of %d", len(events))
        return [None] * len(events)

    await bus.broker.start()
    try:
        await bus.publish(committed("scoped-1", job="job-scoped"))
        await asyncio.wait_for(seen.wait(), timeout=20)
        logger.info("between messages")
    finally:
        logger.removeHandler(capture)
        await bus.broker.stop()
    single = next(line for line in lines if line["message"] == "one message")
    assert (single["job_id"], single["checkpoint_id"]) == ("job-scoped", "scoped-1")
    batch = next(line for line in lines if line["message"].startswith("a batch"))
    assert batch["job_id"] == "job-scoped"
    after = next(line for line in lines if line["message"] == "between messages")
    assert "job_id" not in after
