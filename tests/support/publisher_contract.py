"""The behaviour every `ckpt_ha.bus.port.Publisher` must show, run against the recording fake
and the real `Bus` on a nats-server: an event is identified by its id, so publishing the same
envelope twice stores one event, and a redelivered cause re-publishes the same follow-ups.

Subclass `PublisherContract` and give it a ``publisher`` fixture and a ``stored`` fixture: an
async function returning every envelope the publisher's stream now holds, in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointConflictV1, CheckpointVerifiedV1
from tests.support.events import T0, committed

Stored = Callable[[], Awaitable[list[Envelope[EventData]]]]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def follow_up(ckpt: str) -> EventData:
    return CheckpointVerifiedV1(job_id="job-1", checkpoint_id=ckpt, uri="file:///x", checks=("a",))


class PublisherContract:
    @pytest.fixture
    def publisher(self) -> Any:
        raise NotImplementedError

    @pytest.fixture
    def stored(self) -> Stored:
        raise NotImplementedError

    async def test_a_published_event_is_stored_as_published(
        self, publisher: Any, stored: Stored
    ) -> None:
        ev = committed("c1", traceparent=TRACEPARENT)
        sent = await publisher.publish(ev)
        assert (sent.id, sent.data, sent.traceparent) == (ev.id, ev.data, TRACEPARENT)
        [got] = await stored()
        assert (got.id, got.event_type, got.data) == (ev.id, ev.event_type, ev.data)

    async def test_the_same_envelope_twice_is_stored_once(
        self, publisher: Any, stored: Stored
    ) -> None:
        ev = committed("c1")
        await publisher.publish(ev)
        await publisher.publish(ev)
        await publisher.publish(committed("c2"))
        assert [e.id for e in await stored()] == [ev.id, committed("c2").id]

    async def test_a_redelivered_cause_publishes_the_same_follow_ups_once(
        self, publisher: Any, stored: Stored
    ) -> None:
        cause = committed("c1", traceparent=TRACEPARENT)
        datas = [follow_up("c1"), CheckpointConflictV1(
            job_id="job-1", checkpoint_id="c1", uri="file:///x", reason="same path"
        )]  # fmt: skip
        at = T0 + timedelta(seconds=3)
        await publisher.publish_caused_by(cause, datas, source="test/contract", time=at)
        await publisher.publish_caused_by(cause, datas, source="test/contract", time=at)
        events = await stored()
        assert [e.event_type for e in events] == ["checkpoint.verified", "checkpoint.conflict"]
        expected = [build(d, source="test/contract", time=at, key=cause.id).id for d in datas]
        assert [e.id for e in events] == expected
        # The follow-ups continue the cause's trace.
        assert {e.traceparent.split("-")[1] for e in events if e.traceparent} == {
            TRACEPARENT.split("-")[1]
        }
        assert all(e.traceparent for e in events)

    async def test_another_cause_gives_other_ids(self, publisher: Any, stored: Stored) -> None:
        at = T0 + timedelta(seconds=3)
        for cause in (committed("c1", key="a"), committed("c1", key="b")):
            await publisher.publish_caused_by(
                cause, [follow_up("c1")], source="test/contract", time=at
            )
        assert len({e.id for e in await stored()}) == 2

    async def test_events_published_at_once_are_each_stored_once(
        self, publisher: Any, stored: Stored
    ) -> None:
        """``publish_many``, as a burst's decisions are published: every one stored, a repeat
        (a decision published again) dropped, each result None."""
        events = [committed(f"c{n}") for n in range(5)]
        assert await publisher.publish_many(events) == [None] * 5
        assert await publisher.publish_many([events[1], committed("c5")]) == [None, None]
        assert sorted(e.id for e in await stored()) == sorted(
            e.id for e in [*events, committed("c5")]
        )
