"""`registry rebuild` reproduces exactly what the live registrar built from the same stream."""

from __future__ import annotations

import json
from functools import partial

import nats
import pytest

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import CATALOG
from ckpt_ha.contracts.subjects import event_subject
from ckpt_ha.ops.errors import RebuildWithoutSigningKey, StreamReplaced
from ckpt_ha.ops.rebuild import rebuild, rebuild_registry
from ckpt_ha.registrar.app import build
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import key_for_uri
from tests.support.bus_tools import publish_raw, wait_for
from tests.support.events import committed, deleted, expired, planned, verified

pytestmark = pytest.mark.integration


async def consumer_idle(settings: ServiceSettings, durable: str) -> bool:
    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().consumer_info(settings.events_stream, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


@pytest.mark.parametrize("batch", [1, 3, 500])
async def test_rebuild_reproduces_identical_records(settings: ServiceSettings, batch: int) -> None:
    svc = build(RegistrarSettings.model_validate(settings.model_dump()))
    producer = Bus(settings.bus(), "test-producer")
    await svc.bus.broker.start()
    await producer.broker.start()
    try:
        await producer.publish(verified("late", job="job-b", step=7))  # before its commit
        for i, step in enumerate((10, 20, 30)):
            await producer.publish(committed(f"a{i}", job="job-a", step=step))
        await producer.publish(committed("late", job="job-b", step=7))
        for i in range(3):
            await producer.publish(verified(f"a{i}", job="job-a", step=(10, 20, 30)[i]))
        await producer.publish(expired("a0", job="job-a"))
        await producer.publish(deleted("a0", job="job-a"))
        await producer.publish(committed("a0", job="job-a", key="again"))  # illegal
        # Another job's location: refused at intake, live and in the rebuild alike.
        await producer.publish(committed("evil", job="evil", uri="file:///data/job-a/step-10"))
        subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-a")
        await publish_raw(settings.nats_url, subject, b"garbage")
        dup = committed("a1", job="job-a", step=20)
        await publish_raw(settings.nats_url, subject, dup.to_bytes(), {"Nats-Msg-Id": "dup"})
        # A plan for attempt 2 fences attempt 1's later commit (R17); a rebuild restores both.
        await producer.publish(planned(job="job-a", attempt=2))
        await wait_for(
            lambda: svc.registry.planned_attempt("job-a", "run-1"), what="the fence, live"
        )
        await producer.publish(committed("zombie", job="job-a", step=40, attempt=1))

        async def caught_up() -> bool:
            rec = await svc.registry.get("late")
            zombie = await svc.registry.get("zombie")
            return (
                rec is not None
                and rec.state.value == "valid"
                and zombie is not None
                and zombie.state.value == "fenced"
                and await consumer_idle(settings, "registrar--checkpoints")
                and await consumer_idle(settings, "registrar--fences")
            )

        await wait_for(caught_up, timeout=20, what="registrar to catch up")
    finally:
        await producer.broker.stop()
        await svc.bus.broker.stop()

    live = await svc.registry.dump()
    assert svc.registry.keys.checkpoint("late") in live
    assert await svc.registry.clear() > 0
    assert list(await svc.registry.dump()) == [svc.registry.keys.stream]  # which stream: kept

    key_of = partial(key_for_uri, svc.store)
    report = await rebuild(svc.registry, settings.bus(), CATALOG, key_of, batch=batch)
    rebuilt = await svc.registry.dump()
    await svc.registry.close()

    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(live, sort_keys=True)
    assert svc.registry.keys.fence("job-a") in rebuilt
    assert report.skipped.get("illegal_transition") == 1
    assert report.skipped.get("location_not_owned") == 1
    assert svc.registry.keys.checkpoint("evil") not in rebuilt
    assert report.skipped.get("malformed") == 1
    assert report.duplicates >= 1


async def test_a_rebuild_refuses_a_stream_deleted_and_created_again(
    settings: ServiceSettings,
) -> None:
    """A stream deleted and provisioned again starts at sequence 1 like the original, so the
    completeness check alone accepts it; the registry remembers which stream it was built from
    (the registrar records it at start), and a rebuild from another refuses before it clears
    anything: the registry's records are all that is left of the lost history."""
    svc = build(RegistrarSettings.model_validate(settings.model_dump()))
    producer = Bus(settings.bus(), "test-producer")
    await svc.bus.broker.start()
    await producer.broker.start()
    try:
        await producer.publish(committed("r0", job="job-r", step=10))
        await producer.publish(verified("r0", job="job-r", step=10))

        async def valid() -> bool:
            rec = await svc.registry.get("r0")
            return rec is not None and rec.state.value == "valid"

        await wait_for(valid, timeout=20, what="r0 valid")
    finally:
        await producer.broker.stop()
        await svc.bus.broker.stop()
    original = await svc.registry.built_from()
    assert original is not None
    assert original.startswith(f"{settings.events_stream}@")
    before = await svc.registry.dump()
    key_of = partial(key_for_uri, svc.store)

    nc = await nats.connect(settings.nats_url)
    try:
        await nc.jetstream().delete_stream(settings.events_stream)
        await streams.provision(nc.jetstream(), settings.bus())
    finally:
        await nc.close()
    try:
        with pytest.raises(StreamReplaced, match="deleted and created again"):
            await rebuild_registry(svc.registry, settings.bus(), key_of, clear=True)
        assert await svc.registry.dump() == before  # nothing cleared

        # Meant to start afresh: accepted, and the new stream is the one recorded.
        await rebuild_registry(
            svc.registry, settings.bus(), key_of, clear=True, accept_new_stream=True
        )
        now = await svc.registry.built_from()
        assert now is not None
        assert now != original
        assert await svc.registry.get("r0") is None
    finally:
        await svc.registry.close()


async def test_a_flushed_registry_is_rebuilt_and_records_its_stream(
    settings: ServiceSettings,
) -> None:
    """After a real flush nothing remembers the stream: the rebuild trusts it and records it.
    The services the runbook leaves running (writer-watcher, integrity-checker) go on taking
    their loop leases under the prefix: a rebuild without ``--clear`` does not take those for
    registry data, and leaves them alone."""
    svc = build(RegistrarSettings.model_validate(settings.model_dump()))
    producer = Bus(settings.bus(), "test-producer")
    await producer.broker.start()
    try:
        await producer.publish(committed("f0", job="job-f", step=10))
    finally:
        await producer.broker.stop()
    leases = RedisLeases(svc.registry.r, settings.registry_prefix)
    try:
        assert await leases.take("integrity-checker:scrub", "replica-a", 30.0)
        assert await svc.registry.dump() == {}  # flushed: only a lease under the prefix
        assert await svc.registry.built_from() is None
        await rebuild_registry(
            svc.registry, settings.bus(), partial(key_for_uri, svc.store), clear=False
        )
        assert await leases.holder("integrity-checker:scrub") == "replica-a"
        rec = await svc.registry.get("f0")
        assert rec is not None
        assert rec.state.value == "pending_verification"
        recorded = await svc.registry.built_from()
        assert recorded is not None
        assert recorded.startswith(f"{settings.events_stream}@")
    finally:
        await svc.registry.close()


async def test_a_rebuild_without_the_signing_key_refuses_before_clearing(
    settings: ServiceSettings,
) -> None:
    """Without the key every job-signed event would be refused as forged: the registry would be
    cleared and rebuilt without the checkpoints they made."""
    keyless = settings.model_copy(update={"signing_key": None, "signing_key_previous": None})
    assert keyless.bus().signing_keys == ()
    svc = build(RegistrarSettings.model_validate(settings.model_dump()))
    await svc.registry.remember_stream("kept")
    try:
        with pytest.raises(RebuildWithoutSigningKey, match="no job-signing key"):
            await rebuild_registry(
                svc.registry, keyless.bus(), partial(key_for_uri, svc.store), clear=True
            )
        assert list(await svc.registry.dump()) == [svc.registry.keys.stream]
    finally:
        await svc.registry.close()
