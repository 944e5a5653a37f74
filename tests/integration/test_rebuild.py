"""`registry rebuild` reproduces exactly what the live registrar built from the same stream."""

from __future__ import annotations

import json
from functools import partial

import nats
import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import CATALOG
from ckpt_ha.contracts.subjects import event_subject
from ckpt_ha.ops.rebuild import rebuild
from ckpt_ha.registrar.app import build
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import key_for_uri
from tests.support.bus_tools import publish_raw, wait_for
from tests.support.events import committed, deleted, expired, verified

pytestmark = pytest.mark.integration


async def consumer_idle(settings: ServiceSettings, durable: str) -> bool:
    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().consumer_info(settings.events_stream, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


async def test_rebuild_reproduces_identical_records(settings: ServiceSettings) -> None:
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

        async def caught_up() -> bool:
            rec = await svc.registry.get("late")
            return (
                rec is not None
                and rec.state.value == "valid"
                and await consumer_idle(settings, "registrar--checkpoints")
            )

        await wait_for(caught_up, timeout=20, what="registrar to catch up")
    finally:
        await producer.broker.stop()
        await svc.bus.broker.stop()

    live = await svc.registry.dump()
    assert svc.registry.keys.checkpoint("late") in live
    assert await svc.registry.clear() > 0
    assert await svc.registry.dump() == {}

    report = await rebuild(svc.registry, settings.bus(), CATALOG, partial(key_for_uri, svc.store))
    rebuilt = await svc.registry.dump()
    await svc.registry.close()

    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(live, sort_keys=True)
    assert report.skipped.get("illegal_transition") == 1
    assert report.skipped.get("location_not_owned") == 1
    assert svc.registry.keys.checkpoint("evil") not in rebuilt
    assert report.skipped.get("malformed") == 1
    assert report.duplicates >= 1
