"""Reading the event stream back (rebuild, audits, drills): every message, in stream order,
whatever the batch the reader pulls at a time, and nothing left behind on the server."""

from __future__ import annotations

import nats
import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.stream_reader import iter_events
from ckpt_ha.contracts import CATALOG, Envelope, EventData
from ckpt_ha.contracts.errors import ContractError
from ckpt_ha.contracts.subjects import event_filter, event_subject
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import publish_raw
from tests.support.events import committed
from tests.support.stored_events_contract import check_stored_events, commit


@pytest.mark.parametrize("batch", [1, 3, 256])
async def test_every_message_is_read_in_stream_order_one_batch_at_a_time(
    settings: ServiceSettings, producer: Bus, batch: int
) -> None:
    sent = [committed(f"c{i}", step=(i + 1) * 10) for i in range(7)]
    for event in sent[:4]:
        await producer.publish(event)
    subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-1")
    await publish_raw(settings.nats_url, subject, b"garbage")
    for event in sent[4:]:
        await producer.publish(event)

    cfg = settings.bus()
    read = [
        item if isinstance(item, ContractError) else item.id
        async for item in iter_events(cfg, CATALOG, event_filter(cfg.prefix), batch=batch)
    ]
    assert read[:4] == [e.id for e in sent[:4]]
    assert isinstance(read[4], ContractError)
    assert read[5:] == [e.id for e in sent[4:]]

    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().stream_info(settings.events_stream)
        assert info.state.consumer_count == 0  # the reader's consumers are gone
    finally:
        await nc.close()


async def test_the_last_event_of_a_job_is_read_back_admitted(
    settings: ServiceSettings, producer: Bus
) -> None:
    """`Bus.last_event` (the coordinator's `StoredEvents`) answers as the in-memory fake does;
    a newest message its job did not sign is refused, never taken for an event."""

    async def add(event: Envelope[EventData]) -> None:
        await producer.publish(event)

    await check_stored_events(producer, add)
    forged = commit("job-a", 900).to_bytes()
    subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-a")
    await publish_raw(settings.nats_url, subject, forged, sign=False)
    assert await producer.last_event("checkpoint.committed", "job-a") is None
