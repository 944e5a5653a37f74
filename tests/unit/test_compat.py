"""The upstream workarounds of `ckpt_ha.bus.compat`: each one still needed, and each one working.

The ``test_upstream_*`` tests run the real upstream library WITHOUT the workaround and assert the
problem is still there. When one of them fails after an upgrade, upstream fixed it: delete the
workaround in ``compat`` and the tests here that belong to it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import AsyncIterator
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


def _unpatched_fetch() -> Any:
    """nats-py's own fetch, whether or not a Bus built earlier in this process wrapped it."""
    fetch = JetStreamContext.PullSubscription.fetch
    return getattr(fetch, "__wrapped__", fetch)


@pytest.fixture
async def empty_pull(nats_url: str) -> AsyncIterator[JetStreamContext.PullSubscription]:
    """A durable pull consumer on a fresh, empty stream of its own (deleted afterwards)."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    name = f"COMPAT_{uuid.uuid4().hex[:10]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        yield await js.pull_subscribe(f"{name}.x", durable="compat", stream=name)
    finally:
        await js.delete_stream(name)
        await nc.close()


async def test_upstream_nats_fetch_still_raises_a_bare_asyncio_timeout(
    empty_pull: JetStreamContext.PullSubscription,
) -> None:
    """nats-py bug behind `compat.nats_timeouts`: fails once nats-py is fixed (remove it then).

    A batch fetch whose deadline runs out between its no-wait probe and its lingering pull
    raises a bare `asyncio.TimeoutError`. Short timeouts, as faststream's batch loop uses for
    the rest of a batch, hit that window in a good share of fetches (about one in three here).
    """
    fetch = _unpatched_fetch()
    seen: list[type[BaseException]] = []
    for _ in range(300):
        try:
            await fetch(empty_pull, batch=5, timeout=0.0003)
        except TimeoutError as exc:
            seen.append(type(exc))
            if not isinstance(exc, nats.errors.TimeoutError):
                break
    bare = [kind for kind in seen if not issubclass(kind, nats.errors.TimeoutError)]
    assert bare, f"no bare asyncio.TimeoutError in {len(seen)} timeouts: nats-py fixed it?"


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


async def test_with_the_workaround_a_fetch_times_out_with_the_nats_error_only(
    empty_pull: JetStreamContext.PullSubscription,
) -> None:
    fetch = compat.nats_timeouts(_unpatched_fetch())
    for _ in range(100):
        try:
            await fetch(empty_pull, batch=5, timeout=0.0003)
        except nats.errors.TimeoutError:
            continue


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


# -- queued_next_msg: nats-py starts tasks for a message already queued ------------------------


def _unpatched_next_msg() -> Any:
    """nats-py's own ``Subscription.next_msg``, whether or not a Bus wrapped it already."""
    next_msg = Subscription.next_msg
    return getattr(next_msg, "__wrapped__", next_msg)


@pytest.fixture
async def queued(nats_url: str) -> AsyncIterator[tuple[nats.NATS, Subscription, str]]:
    """A plain subscription (no callback) on a subject of its own, and that subject."""
    nc = await nats.connect(nats_url)
    subject = f"compat.queued.{uuid.uuid4().hex[:10]}"
    sub = await nc.subscribe(subject)
    try:
        yield nc, sub, subject
    finally:
        await nc.close()


async def _queue_one(nc: nats.NATS, sub: Subscription, subject: str, data: bytes) -> None:
    await nc.publish(subject, data)
    await nc.flush()
    for _ in range(200):  # the read loop queues it shortly after the flush returns
        if sub.pending_msgs:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the published message never reached the subscription's queue")


def _counting_tasks() -> list[int]:
    """Count the tasks the running loop creates from now on (one entry per task)."""
    loop = asyncio.get_running_loop()
    made: list[int] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(1)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    return made


async def test_upstream_next_msg_still_starts_tasks_for_a_queued_message(
    queued: tuple[nats.NATS, Subscription, str],
) -> None:
    """nats-py gap behind `compat.queued_next_msg`: fails once nats-py hands a queued message
    over without starting a task (remove the workaround then)."""
    nc, sub, subject = queued
    await _queue_one(nc, sub, subject, b"one")
    made = _counting_tasks()
    try:
        msg = await _unpatched_next_msg()(sub, timeout=1)
    finally:
        asyncio.get_running_loop().set_task_factory(None)
    assert msg.data == b"one"
    assert made, "nats-py took a queued message without a task: drop compat.queued_next_msg"


async def test_with_the_workaround_a_queued_message_is_taken_at_once(
    queued: tuple[nats.NATS, Subscription, str],
) -> None:
    nc, sub, subject = queued
    next_msg = compat.queued_next_msg(_unpatched_next_msg())
    await _queue_one(nc, sub, subject, b"12345")
    assert (sub.pending_msgs, sub.pending_bytes) == (1, 5)
    made = _counting_tasks()
    try:
        msg = await next_msg(sub, timeout=1)
    finally:
        asyncio.get_running_loop().set_task_factory(None)
    assert msg.data == b"12345"
    assert made == []
    assert (sub.pending_msgs, sub.pending_bytes) == (0, 0)  # upstream's bookkeeping, kept


async def test_with_the_workaround_an_empty_queue_waits_as_upstream_does(
    queued: tuple[nats.NATS, Subscription, str],
) -> None:
    nc, sub, subject = queued
    next_msg = compat.queued_next_msg(_unpatched_next_msg())
    with pytest.raises(nats.errors.TimeoutError):
        await next_msg(sub, timeout=0.05)
    later = asyncio.create_task(next_msg(sub, timeout=2))
    await asyncio.sleep(0.05)
    await nc.publish(subject, b"later")
    assert (await later).data == b"later"
    assert (sub.pending_msgs, sub.pending_bytes) == (0, 0)


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
