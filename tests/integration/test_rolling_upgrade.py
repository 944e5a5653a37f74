"""A rolling upgrade against the real nats-server: an event of a version newer than a consumer
knows is parked for a consumer that knows it, never dead-lettered for being new; the retry cap
that JetStream no longer enforces is enforced by the bus, also for messages that never got an
answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.nats_broker import UNLIMITED
from ckpt_ha.contracts import CATALOG, Envelope, EventCatalog, EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.resume import LoadBlame, ResumeLoadFailedV1, ResumeLoadFailedV2
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.events import committed, verified

pytestmark = pytest.mark.integration

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def catalog_without(*left_out: type[EventData]) -> EventCatalog:
    """The catalogue of an older (or newer) release: every model but ``left_out``, and no
    upcaster into a left-out version."""
    catalog = EventCatalog()
    for model in CATALOG.models().values():
        if model not in left_out:
            catalog.register(model)
    return catalog


def load_failed(plan: str, version: int) -> Envelope[EventData]:
    common = {"job_id": "job-up", "plan_id": plan, "run_id": "r1", "checkpoint_id": "c1"}
    data: EventData
    if version == 1:
        data = ResumeLoadFailedV1(**common, reason="v1 failure")
    else:
        data = ResumeLoadFailedV2(**common, reason="v2 failure", blame=LoadBlame.ATTEMPT)
    return build(data, source="test", time=NOW, key=plan)


def collecting_bus(
    settings: ServiceSettings, catalog: EventCatalog, seen: list[str], metrics: ServiceMetrics
) -> Bus:
    """A consumer of `resume.load_failed` on the durable ``upgrade--failed``, as a release
    with ``catalog`` would run it."""
    bus = Bus(settings.bus(), "upgrade", catalog)
    bus.dead_letters.on_park = metrics.park
    bus.dead_letters.on_dead_letter = metrics.dead_letter

    @bus.consumer("failed", event_filter(settings.subject_prefix, "resume.load_failed"))
    async def on_failed(event: Envelope[EventData]) -> None:
        seen.append(f"{event.data.subject_key()} v{event.version}")

    return bus


def parked(metrics: ServiceMetrics) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == "ckpt_ha_parked_messages"
        for s in family.samples
        if s.name.endswith("_total")
    )


async def consumer_counts(settings: ServiceSettings, durable: str) -> tuple[int, int]:
    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().consumer_info(settings.events_stream, durable)
        return (info.num_pending or 0) + (info.num_ack_pending or 0), info.config.max_deliver or 0
    finally:
        await nc.close()


async def dead_letter_codes(settings: ServiceSettings) -> list[str]:
    msgs = await stream_messages(settings.nats_url, settings.dead_letter_stream)
    return [str((m.headers or {}).get("Ckpt-Error-Code")) for m in msgs]


def _all(items: Iterable[str], want: set[str]) -> bool:
    return want <= set(items)


async def test_an_old_consumer_parks_a_newer_version_and_a_new_one_takes_it(
    settings: ServiceSettings, producer: Bus
) -> None:
    # Parks come round fast here, so the message is parked past the cap of 3 deliveries
    # before the new consumer starts: those parks must not count against it.
    settings = settings.model_copy(update={"park_delay_s": 0.3})
    old_seen: list[str] = []
    old_metrics = ServiceMetrics("upgrade-old")
    old = collecting_bus(settings, catalog_without(ResumeLoadFailedV2), old_seen, old_metrics)
    await old.broker.start()
    try:
        for plan, version in (("p-before", 1), ("p-new", 2), ("p-after", 1)):
            await producer.publish(load_failed(plan, version))
        await wait_for(
            lambda: asyncio.sleep(0, _all(old_seen, {"p-before v1", "p-after v1"})),
            what="the old consumer handling the v1 neighbours",
        )
        await wait_for(
            lambda: asyncio.sleep(0, parked(old_metrics) >= settings.max_deliver + 2),
            timeout=20,
            what="the v2 event parked past the cap",
        )
        assert "p-new v2" not in " ".join(old_seen)
        assert (await consumer_counts(settings, "upgrade--failed"))[0] == 1  # still there
        assert await dead_letter_codes(settings) == []
    finally:
        await old.broker.stop()

    new_seen: list[str] = []
    new = collecting_bus(settings, CATALOG, new_seen, ServiceMetrics("upgrade-new"))
    await new.broker.start()
    try:
        await wait_for(
            lambda: asyncio.sleep(0, "p-new v2" in new_seen), what="the new consumer taking v2"
        )
        await wait_for(
            lambda: _zero_pending(settings), what="the parked message acknowledged at last"
        )
    finally:
        await new.broker.stop()
    assert new_seen == ["p-new v2"]  # the neighbours were acked by the old consumer
    assert await dead_letter_codes(settings) == []


async def _zero_pending(settings: ServiceSettings) -> bool:
    return (await consumer_counts(settings, "upgrade--failed"))[0] == 0


async def test_an_older_unknown_version_and_an_unknown_type_are_still_dead_lettered(
    settings: ServiceSettings, producer: Bus
) -> None:
    """A release that retired v1 will never know it: refused at once, not parked."""
    seen: list[str] = []
    metrics = ServiceMetrics("upgrade-retired")
    bus = collecting_bus(settings, catalog_without(ResumeLoadFailedV1), seen, metrics)
    await bus.broker.start()
    try:
        await producer.publish(load_failed("p-old", 1))
        await producer.publish(load_failed("p-current", 2))
        codes = await wait_for(lambda: dead_letter_codes(settings), what="a dead letter")
        await wait_for(lambda: asyncio.sleep(0, seen == ["p-current v2"]), what="v2 handled")
    finally:
        await bus.broker.stop()
    assert codes == ["unsupported_version"]
    assert parked(metrics) == 0


async def test_the_registrar_dead_letters_an_unknown_checkpoint_event_type(
    registrar: Registrar, producer: Bus, settings: ServiceSettings
) -> None:
    """An unknown type is no version of anything this consumer knows: refused, not parked."""
    from tests.support.bus_tools import publish_raw

    subject = f"{settings.subject_prefix}.ev.checkpoint.exploded.v1.job-1"
    await publish_raw(
        settings.nats_url, subject, b'{"type": "ckpt-ha.checkpoint.exploded.v1", "data": {}}'
    )
    await producer.publish(committed("after-unknown"))
    codes = await wait_for(lambda: dead_letter_codes(settings), what="a dead letter")
    assert codes == ["unknown_type"]

    async def neighbour() -> bool:
        rec = await registrar.registry.get("after-unknown")
        return rec is not None and rec.state is CheckpointState.PENDING_VERIFICATION

    await wait_for(neighbour, what="the neighbour applied")


async def test_a_message_delivered_past_the_cap_without_an_answer_is_dead_lettered_unhandled(
    settings: ServiceSettings, producer: Bus
) -> None:
    """A handler that crashes its process never answers; JetStream's cap is off, so the bus
    dead-letters the message on the delivery after the cap, before the handler runs again."""
    durable = "crashy--work"
    event = verified("crash-loop")
    await producer.publish(event)
    nc = await nats.connect(settings.nats_url)
    try:
        sub = await nc.jetstream().pull_subscribe(
            event_filter(settings.subject_prefix, "checkpoint.verified"),
            durable=durable,
            stream=settings.events_stream,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=0.3,
                max_deliver=UNLIMITED,
                deliver_policy=DeliverPolicy.ALL,
            ),
        )
        for _ in range(settings.max_deliver):  # the "process" dies holding it, every time
            [msg] = await sub.fetch(1, timeout=5)
            assert msg.metadata.sequence.stream == 1
            await asyncio.sleep(0.5)
        await sub.unsubscribe()
    finally:
        await nc.close()
    handled: list[str] = []
    bus = Bus(settings.bus(), "crashy")

    @bus.consumer("work", event_filter(settings.subject_prefix, "checkpoint.verified"))
    async def work(event: Envelope[EventData]) -> None:
        handled.append(event.id)

    await bus.broker.start()
    try:
        codes = await wait_for(lambda: dead_letter_codes(settings), what="the dead letter")
        await wait_for(lambda: _zero(settings, durable), what="the message terminated")
    finally:
        await bus.broker.stop()
    assert codes == ["max_deliver"]
    assert handled == []
    [letter] = await stream_messages(settings.nats_url, settings.dead_letter_stream)
    assert letter.data == event.to_bytes()
    assert (letter.headers or {})["Ckpt-Delivery-Count"] == str(settings.max_deliver + 1)


async def _zero(settings: ServiceSettings, durable: str) -> bool:
    return (await consumer_counts(settings, durable))[0] == 0


async def test_a_durable_created_with_a_delivery_cap_is_uncapped_at_start(
    settings: ServiceSettings,
) -> None:
    """Durables of an older release had JetStream's max_deliver=5: it would stop a parked
    message; the bus lifts it (and changes nothing else) when it starts."""
    durable = "upgrade--failed"
    nc = await nats.connect(settings.nats_url)
    try:
        await nc.jetstream().add_consumer(
            settings.events_stream,
            config=ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=settings.ack_wait_s,
                max_deliver=5,
                filter_subject=event_filter(settings.subject_prefix, "resume.load_failed"),
            ),
        )
    finally:
        await nc.close()
    assert (await consumer_counts(settings, durable))[1] == 5
    bus = collecting_bus(settings, CATALOG, [], ServiceMetrics("upgrade-uncap"))
    await bus.broker.start()
    try:
        assert (await consumer_counts(settings, durable))[1] == UNLIMITED
    finally:
        await bus.broker.stop()
