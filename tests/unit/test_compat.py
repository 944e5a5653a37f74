"""The upstream workarounds of `ckpt_ha.bus.compat`: each one still needed, and each one working.

The ``test_upstream_*`` tests run the real upstream library WITHOUT the workaround and assert the
problem is still there. When one of them fails after an upgrade, upstream fixed it: delete the
workaround in ``compat`` and the tests here that belong to it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Annotated, Any

import nats
import nats.errors
import pytest
from faststream import Context, FastStream
from faststream.nats import NatsBroker, PullSub
from faststream.nats.message import NatsBatchMessage
from faststream.nats.subscriber.usecases import stream_pull_subscriber
from faststream.specification import AsyncAPI
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from pydantic import BaseModel

from ckpt_ha.bus import compat
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.config import BusConfig

# -- nats_timeouts: nats-py's fetch raises a bare asyncio.TimeoutError ------------------------


def test_upstream_faststream_batch_loop_still_catches_only_the_nats_timeout() -> None:
    """faststream half of the `compat.nats_timeouts` bug: fails once faststream's batch loop
    catches the builtin `TimeoutError` (then the workaround can go as well).

    ``BatchPullStreamSubscriber._consume_pull`` has ``except TimeoutError`` with the name bound
    to nats' class, which a bare `asyncio.TimeoutError` is not an instance of.
    """
    caught = stream_pull_subscriber.TimeoutError
    assert caught is nats.errors.TimeoutError
    assert not issubclass(asyncio.TimeoutError, caught)
    assert "except TimeoutError:" in inspect.getsource(
        stream_pull_subscriber.BatchPullStreamSubscriber._consume_pull
    )


async def test_a_bare_timeout_becomes_the_nats_timeout() -> None:
    async def bare(batch: int = 1, timeout: float | None = None) -> list[Msg]:
        raise TimeoutError  # what nats-py raises when its deadline passes between requests

    with pytest.raises(nats.errors.TimeoutError):
        await compat.nats_timeouts(bare)(5, timeout=0.1)


async def test_results_and_nats_errors_pass_unchanged() -> None:
    sentinel = nats.errors.TimeoutError()

    async def nats_timeout() -> list[Msg]:
        raise sentinel

    async def fetched() -> list[Msg]:
        return []

    with pytest.raises(nats.errors.TimeoutError) as caught:
        await compat.nats_timeouts(nats_timeout)()
    assert caught.value is sentinel
    assert await compat.nats_timeouts(fetched)() == []


def test_building_buses_installs_it_once() -> None:
    Bus(BusConfig(url="nats://127.0.0.1:1"), "a")
    Bus(BusConfig(url="nats://127.0.0.1:1"), "b")
    fetch = JetStreamContext.PullSubscription.fetch
    assert getattr(fetch, "ckpt_nats_timeouts", False)
    assert not getattr(fetch.__wrapped__, "ckpt_nats_timeouts", False)  # not wrapped twice
    next_msg = Subscription.next_msg
    assert getattr(next_msg, "ckpt_queued_next_msg", False)
    assert not getattr(next_msg.__wrapped__, "ckpt_queued_next_msg", False)


# -- document_payload: faststream documents a payload only from the handler's signature -------


class Ping(BaseModel):
    seq: int


def _batch_payload_schema(document: bool) -> dict[str, Any]:
    """The AsyncAPI message payload of a batch subscriber like `Bus.batch_consumer` builds."""
    broker = NatsBroker()

    async def on_batch(
        message: Annotated[NatsBatchMessage, Context("message")], body: Any = None
    ) -> None:
        """Handler whose decoder yields nothing: the body annotation says nothing of Ping."""

    if document:
        compat.document_payload(on_batch, "body", list[Ping] | None)
    broker.subscriber(
        "compat.ping",
        stream="COMPAT_DOC",
        durable="compat",
        pull_sub=PullSub(batch_size=4, timeout=0.1, batch=True),
    )(on_batch)
    app = FastStream(broker, specification=AsyncAPI(title="compat", version="1"))
    doc = app.schema.to_specification().to_jsonable()
    return dict(doc.get("components", {}))


def test_upstream_faststream_subscriber_still_takes_no_payload_type() -> None:
    """faststream gap behind `compat.document_payload`: fails once ``subscriber()`` accepts a
    documented payload type (pass it there and remove the workaround then)."""
    params = set(inspect.signature(NatsBroker.subscriber).parameters) - {"include_in_schema"}
    about_payload = {p for p in params if any(w in p for w in ("payload", "model", "schema"))}
    assert not about_payload, f"faststream now takes {about_payload}: use it instead"
    assert "Ping" not in json.dumps(_batch_payload_schema(document=False))


def test_with_the_workaround_the_batch_payload_is_documented() -> None:
    assert "Ping" in json.dumps(_batch_payload_schema(document=True))


def test_document_payload_refuses_an_unknown_parameter() -> None:
    async def handler(body: Any = None) -> None:
        """No parameter named payload."""

    with pytest.raises(ValueError, match="payload"):
        compat.document_payload(handler, "payload", int)
    assert inspect.signature(handler).parameters["body"].annotation == "Any"


# -- header_lines: nats-py checks header names for whitespace a character at a time -----------


def _upstream_header_lines() -> Any:
    """nats-py's own header parse, whether or not a Bus replaced it already."""
    parse = Client.__dict__["_parse_header_lines"].__func__
    return getattr(parse, "__wrapped__", parse)


def test_upstream_header_parse_still_checks_names_a_character_at_a_time() -> None:
    """nats-py cost behind `compat.header_lines`: fails once nats-py checks a header name
    without a generator step per character (drop the workaround then)."""
    assert "any(c.isspace() for c in key)" in inspect.getsource(_upstream_header_lines())


HEADER_BLOCKS = [
    b"",
    b"Nats-Msg-Id: abc\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n",
    b"A:1\r\nA: 2\r\n",  # the later value wins
    b"Name:Value\r\nTabbed:\tv\r\n  Spaced  :  x  \r\n",
    b"no colon\r\n:empty name\r\n",
    b"Bad Name: v\r\nBad\tName: v\r\nBad\x1cName: v\r\nGood-Name: v\r\n",
    b"\x1cLead: v\r\nTrail\x1f: v\r\n\x0bVt: v\r\n",
    "Caf\u00e9: v\r\nutf8: caf\u00e9\r\n".encode(),
    b"bad-utf8: \xff\xfe\r\nx: y",
    b"Ckpt-Error: a: b: c\r\n\r\n\r\nlast: 1",
]


@pytest.mark.parametrize("block", HEADER_BLOCKS)
def test_the_workaround_parses_headers_exactly_as_upstream(block: bytes) -> None:
    assert compat.header_lines(block) == _upstream_header_lines()(block)


def test_the_workaround_agrees_with_upstream_on_every_one_byte_name() -> None:
    """Every byte as a header name, alone and inside one: the whitespace rule is upstream's."""
    upstream = _upstream_header_lines()
    for b in range(256):
        for name in (bytes([b]), b"a" + bytes([b]) + b"z"):
            block = name + b": v\r\n"
            assert compat.header_lines(block) == upstream(block), name


def test_building_a_bus_installs_the_header_parse_once() -> None:
    Bus(BusConfig(url="nats://127.0.0.1:1"), "a")
    Bus(BusConfig(url="nats://127.0.0.1:1"), "b")
    parse = Client.__dict__["_parse_header_lines"].__func__
    assert getattr(parse, "ckpt_header_lines", False)
    assert not getattr(parse.__wrapped__, "ckpt_header_lines", False)
    assert Client._parse_header_lines(b"k: v\r\n") == {"k": "v"}
