"""The upstream workarounds of `ckpt_ha.bus.compat` that need a real nats-server: each one still
needed, and each one working (the others: tests/unit/test_compat.py).

The ``test_upstream_*`` tests run the real upstream library WITHOUT the workaround and assert the
problem is still there. When one of them fails after an upgrade, upstream fixed it: delete the
workaround and its tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from ckpt_ha.bus import compat

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


async def test_with_the_workaround_a_fetch_times_out_with_the_nats_error_only(
    empty_pull: JetStreamContext.PullSubscription,
) -> None:
    fetch = compat.nats_timeouts(_unpatched_fetch())
    for _ in range(100):
        try:
            await fetch(empty_pull, batch=5, timeout=0.0003)
        except nats.errors.TimeoutError:
            continue


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


# -- header_lines: nats-py checks header names for whitespace a character at a time -----------
