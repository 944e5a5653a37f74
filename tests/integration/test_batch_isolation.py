"""One bad message in a batch is dead-lettered alone; its neighbours are handled (real NATS, Redis).

The registrar consumes checkpoint events in batches. Before the bounds, a committed event with a
5,000-digit step raised a plain ValueError while decoding: the whole batch stayed unsettled, was
redelivered until ``max_deliver``, and every good event in it was dead-lettered with it.
"""

from __future__ import annotations

import dataclasses
import json

import nats
import pytest

from ckpt_ha.bus.batching import BatchHandler
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointState
from ckpt_ha.contracts.subjects import aggregate_filter, event_subject
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import publish_raw, stream_messages, wait_for
from tests.support.events import committed

pytestmark = pytest.mark.integration

GOOD = 30


def _with_huge_step(event: Envelope[EventData]) -> bytes:
    doc = json.loads(event.to_bytes())
    doc["data"]["step"] = 1  # placeholder, replaced textually: Python's json refuses the real one
    return json.dumps(doc).encode().replace(b'"step": 1', b'"step": ' + b"9" * 5000)


async def _dead_letters(settings: ServiceSettings) -> list[dict[str, str]]:
    msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
    return [
        {**{k: str(v) for k, v in (m.headers or {}).items()}, "body": m.data.decode()} for m in msgs
    ]


async def test_a_huge_number_is_dead_lettered_alone_and_the_batch_registers(
    settings: ServiceSettings, producer: Bus
) -> None:
    # ``producer`` started: the streams exist before anything is published.
    subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-1")
    # Published before the registrar starts, so the 31 arrive in one fetched batch (fetch 32).
    for i in range(GOOD):
        if i == GOOD // 2:
            await publish_raw(settings.nats_url, subject, _with_huge_step(committed("bad")))
        event = committed(f"good-{i}", step=i, key=f"k{i}")
        await publish_raw(settings.nats_url, subject, event.to_bytes(), {"Nats-Msg-Id": event.id})
    registrar = build_registrar(RegistrarSettings.model_validate(settings.model_dump()))
    await registrar.bus.broker.start()
    try:

        async def all_registered() -> bool:
            found = [await registrar.registry.get(f"good-{i}") for i in range(GOOD)]
            return all(
                r is not None and r.state is CheckpointState.PENDING_VERIFICATION for r in found
            )

        await wait_for(all_registered, timeout=30, what=f"all {GOOD} good checkpoints registered")
        letters = await wait_for(lambda: _dead_letters(settings), timeout=15, what="dead letter")
        # Settled: nothing left pending or unacknowledged on the consumer.
        await wait_for(
            lambda: _settled(registrar.bus),
            timeout=15,
            what="every message of the batch acked or dead-lettered",
        )
        letters = await _dead_letters(settings)
    finally:
        await registrar.bus.broker.stop()
        await registrar.registry.close()
    assert len(letters) == 1, letters
    [letter] = letters
    assert letter["Ckpt-Error-Code"] == "malformed"
    assert "number out of range" in letter["Ckpt-Error"]
    assert await registrar.registry.get("bad") is None


async def _settled(bus: Bus) -> bool:
    return all(pending == 0 and acks == 0 for _, pending, acks, _ in await bus.consumer_info())


async def test_a_handler_failing_for_the_batch_is_retried_one_event_at_a_time(
    settings: ServiceSettings, producer: Bus
) -> None:
    """A handler that raises for any batch holding one poison event: every other event of
    that batch is still handled and acked; only the poison one is retried and, after
    ``max_deliver``, dead-lettered with its own error."""
    handled: list[str] = []
    consumer = Bus(settings.bus(), "isolation-test")

    @consumer.batch_consumer("checkpoints", aggregate_filter(settings.subject_prefix, "checkpoint"))
    async def project(events: list[Envelope[EventData]]) -> list[BaseException | None]:
        ids = [e.data.checkpoint_id for e in events if isinstance(e.data, CheckpointCommittedV1)]
        if "poison" in ids:
            raise RuntimeError("the store refused the batch: 'poison' has a value it cannot hold")
        handled.extend(ids)
        return [None] * len(events)

    consumer.watch_max_deliveries()  # as every service does: a delivery lost in a pull counts
    for i in range(10):
        await producer.publish(committed(f"c{i}", step=i, key=f"k{i}"))
        if i == 4:
            await producer.publish(committed("poison", key="poison"))
    await consumer.broker.start()
    try:
        await wait_for(lambda: _async(len(handled) >= 10), timeout=20, what="10 events handled")
        letters = await wait_for(lambda: _dead_letters(settings), timeout=30, what="dead letter")
    finally:
        await consumer.broker.stop()
    # At least once each (a redelivery may repeat one), and never the poison one.
    assert set(handled) == {f"c{i}" for i in range(10)}
    [letter] = letters
    assert letter["Ckpt-Error-Code"] == "max_deliver"
    assert '"checkpoint_id":"poison"' in letter["body"]


async def _async(value: bool) -> bool:
    return value


async def test_a_prompt_batch_consumer_hands_a_lone_event_over_without_the_linger(
    settings: ServiceSettings, producer: Bus
) -> None:
    """A batch is handed over when full or when its linger is over, so a lone event waits out
    the linger; a consumer whose events someone waits on (``prompt``: the coordinator's
    failures) lingers `BusConfig.prompt_linger_s` instead. With the projections' linger at a
    minute, the prompt consumer has the lone event while the other one still holds it."""
    cfg = dataclasses.replace(settings.bus(), batch_linger_s=60.0, prompt_linger_s=0.02)
    consumer = Bus(cfg, "linger-test")
    seen: dict[str, list[str]] = {"prompt": [], "lingering": []}

    def recorder(name: str) -> BatchHandler:
        async def record(events: list[Envelope[EventData]]) -> list[BaseException | None]:
            seen[name].extend(e.id for e in events)
            return [None] * len(events)

        return record

    checkpoints = aggregate_filter(settings.subject_prefix, "checkpoint")
    consumer.batch_consumer("prompt", checkpoints, prompt=True)(recorder("prompt"))
    consumer.batch_consumer("lingering", checkpoints)(recorder("lingering"))
    await consumer.broker.start()
    try:
        # Both wait in a lingering pull (a fetch started later would find the event at once).
        await wait_for(lambda: _pulls_waiting(settings, consumer), timeout=10, what="pulls")
        event = await producer.publish(committed("lone", key="lone"))
        await wait_for(lambda: _async(bool(seen["prompt"])), timeout=20, what="prompt handled")
        assert seen["prompt"] == [event.id]
        assert seen["lingering"] == []  # still lingering: up to a minute for 255 more
    finally:
        await consumer.broker.stop()


async def _pulls_waiting(settings: ServiceSettings, bus: Bus) -> bool:
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        infos = [await js.consumer_info(s, d) for d, s in bus.consumers.items()]
    finally:
        await nc.close()
    return all((info.num_waiting or 0) > 0 for info in infos)
