"""Workarounds for upstream bugs and gaps, in one place.

Each one says what the upstream library does wrong, in which version it was seen, and when the
workaround can go. Each has a test in ``tests/unit/test_compat.py`` that exercises the upstream
library *without* the workaround and asserts the problem is still there: when an upgrade fixes
it, that test fails, and the workaround (and its test) should be deleted.

Nothing here runs at import time: a workaround that patches a library is installed by the code
that needs it (`install_nats_fetch_timeouts` when a `Bus` is built).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

__all__ = [
    "document_payload",
    "header_lines",
    "install_header_lines",
    "install_nats_fetch_timeouts",
    "install_queued_next_msg",
    "nats_timeouts",
    "queued_next_msg",
]

Fetch = Callable[..., Awaitable[list[Msg]]]

_MARK = "ckpt_nats_timeouts"


def nats_timeouts(fetch: Fetch) -> Fetch:
    """``fetch`` raising only `nats.errors.TimeoutError` for a timeout, never a bare one.

    Upstream (seen in nats-py 2.16.0 with faststream 0.7.8): nats-py's
    ``PullSubscription.fetch`` with ``batch > 1`` raises a bare `asyncio.TimeoutError` when its
    deadline passes between its two pull requests (``raise asyncio.TimeoutError`` in
    ``_fetch_n``), while faststream's batch loop (``BatchPullStreamSubscriber._consume_pull``,
    which keeps fetching with ever smaller timeouts) catches only the nats error. The bare one
    escapes, faststream restarts the loop, and the messages already gathered for that batch are
    dropped unacked: JetStream redelivers them only after ``ack_wait``, behind later events, so
    e.g. a checkpoint's ``committed`` arrives after its ``verified`` and is dead-lettered as an
    illegal transition. The nats error subclasses the asyncio one, so other callers see no change.

    Remove when nats-py raises only its own error from fetch, or faststream's batch loop
    catches the builtin `TimeoutError` (``test_compat`` fails on either).
    """

    @functools.wraps(fetch)
    async def wrapped(*args: Any, **kwargs: Any) -> list[Msg]:
        try:
            return await fetch(*args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc

    setattr(wrapped, _MARK, True)
    return wrapped


def install_nats_fetch_timeouts() -> None:
    """Wrap ``JetStreamContext.PullSubscription.fetch`` with `nats_timeouts`. Idempotent."""
    pull = JetStreamContext.PullSubscription
    if not getattr(pull.fetch, _MARK, False):
        pull.fetch = nats_timeouts(pull.fetch)  # type: ignore[method-assign,assignment]


NextMsg = Callable[..., Awaitable[Msg]]

_QUEUED_MARK = "ckpt_queued_next_msg"


def queued_next_msg(next_msg: NextMsg) -> NextMsg:
    """``next_msg`` that hands over a message already queued without waiting for it.

    Upstream gap (seen in nats-py 2.16.0): ``Subscription.next_msg`` starts a task running
    ``asyncio.wait_for(queue.get(), timeout)`` (a second task inside ``wait_for``, a timer, and
    a ``uuid4`` name) for every message, also when the message is already in the subscription's
    queue. ``PullSubscription.fetch`` calls it once per message of a batch, so a fetch of 256
    messages made about 512 tasks: about 90 µs of CPU per message here, more than half of what
    a bare consume+ack loop costs (`bench/bench_consume.py`). A queued message is now taken at
    once, with the same bookkeeping as upstream's (pending bytes, ``task_done``); an empty queue,
    a closed connection or a callback subscription take upstream's path unchanged.

    Remove when nats-py takes a queued message without a task (``test_compat`` fails then).
    """

    @functools.wraps(next_msg)
    async def wrapped(self: Subscription, timeout: float | None = 1.0) -> Msg:  # noqa: ASYNC109 - upstream's signature
        queue = self._pending_queue
        if self._cb is None and not queue.empty() and not self._conn.is_closed:
            msg = queue.get_nowait()
            self._pending_size -= len(msg.data)
            queue.task_done()
            return msg
        return await next_msg(self, timeout)

    setattr(wrapped, _QUEUED_MARK, True)
    return wrapped


def install_queued_next_msg() -> None:
    """Wrap ``Subscription.next_msg`` with `queued_next_msg`. Idempotent."""
    if not getattr(Subscription.next_msg, _QUEUED_MARK, False):
        Subscription.next_msg = queued_next_msg(Subscription.next_msg)  # type: ignore[method-assign,assignment]


def header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's header block parse (``Client._parse_header_lines``), with the same result.

    Upstream cost (seen in nats-py 2.16.0): it rejects a header name holding whitespace with
    ``any(c.isspace() for c in key)``, a generator step per character of every name of every
    message (our events carry five to seven headers): about 5% of a consumer's CPU. Here the
    same rule is one ``str.split`` (it splits on exactly the characters ``str.isspace`` accepts,
    so a name splits into itself alone exactly when it holds none, the empty name included).

    Remove when nats-py parses names without a per-character loop (``test_compat`` fails then).
    """
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if key and key.split() != [key]:
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


_HEADERS_MARK = "ckpt_header_lines"


def install_header_lines() -> None:
    """Make `header_lines` nats-py's header parse. Idempotent."""
    current = Client.__dict__["_parse_header_lines"]
    if getattr(current.__func__, _HEADERS_MARK, False):
        return

    @functools.wraps(current.__func__)
    def parse(raw: bytes) -> dict[str, str]:
        return header_lines(raw)

    setattr(parse, _HEADERS_MARK, True)
    Client._parse_header_lines = staticmethod(parse)  # type: ignore[method-assign]


def document_payload(handler: Callable[..., Any], parameter: str, annotation: Any) -> None:
    """Make faststream's AsyncAPI document show ``annotation`` as the payload of ``handler``.

    Upstream gap (faststream 0.7.8): a subscriber's documented message type comes only from
    the annotation of its handler's body parameter; ``subscriber()`` has no argument for it.
    A batch handler whose decoder yields nothing (each body is decoded by the bus) still has to
    document what one message is, and that type is only known at run time, so the handler's
    ``__signature__`` is rewritten with ``annotation`` on ``parameter`` (the other parameters
    and the code are untouched; faststream calls the handler with the same arguments).

    Remove when faststream's ``subscriber()`` takes the documented payload type as an argument.
    """
    sig = inspect.signature(handler)
    params = [
        p.replace(annotation=annotation) if name == parameter else p
        for name, p in sig.parameters.items()
    ]
    if parameter not in sig.parameters:
        raise ValueError(f"{handler.__name__} has no parameter {parameter!r}")
    handler.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
