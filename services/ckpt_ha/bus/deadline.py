"""How long a handler may hold its messages: in-progress acks up to a deadline, then let go.

JetStream redelivers a message whose ``ack_wait`` passed without an answer; a handler that runs
long keeps its message with in-progress acks (`keep_alive`). Without a bound, a handler waiting
on a hung Redis or a hung storage mount kept its message (and, handling in stream order, its
whole consumer) forever: no redelivery, no dead letter. `within_deadline` cancels the handler at
``BusConfig.handler_deadline_s`` and reports `HandlerDeadlineExceeded`, a transient error: the
message is nak'ed with backoff, and dead-lettered on its last delivery like any other failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import nats.errors
from nats.aio.msg import Msg

from ckpt_ha.core.errors import TransientError

T = TypeVar("T")


class HandlerDeadlineExceeded(TransientError):
    """The handler did not finish within its deadline and was cancelled (a hung dependency, or
    work too large for the deadline: raise ``CKPT_HA_HANDLER_DEADLINE_S`` then)."""

    code = "handler_deadline"

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        super().__init__(f"handler did not finish within its deadline of {deadline_s:g}s")


async def within_deadline(work: Awaitable[T], deadline_s: float) -> T:
    """``await work``, cancelled after ``deadline_s``: `HandlerDeadlineExceeded` then.

    The work runs in the caller's task (no new task, so the caller's context, e.g. its trace
    span, is the work's), and an error the work raises itself, a `TimeoutError` of its own
    included, passes through unchanged.
    """
    scope = asyncio.timeout(deadline_s)
    try:
        async with scope:
            return await work
    except TimeoutError:
        if scope.expired():
            raise HandlerDeadlineExceeded(deadline_s) from None
        raise


async def keep_alive(raws: Sequence[Msg], interval: float, until: float) -> None:
    """In-progress acks every ``interval`` seconds while a handler runs, never past ``until``
    (the event loop's clock): a handler past its deadline holds nothing."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            left = until - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(interval, left))
            if loop.time() >= until:
                return
            for raw in raws:
                if not raw.is_acked:
                    # A lost connection loses this ack only: the next one, or a redelivery
                    # after ack_wait, follows.
                    with contextlib.suppress(nats.errors.Error, OSError):
                        await raw.in_progress()


def keep_alive_task(
    raws: Sequence[Msg], ack_wait_s: float, deadline_s: float
) -> asyncio.Task[None]:
    """`keep_alive` as a task: acks three times per ``ack_wait`` until ``deadline_s`` from now."""
    until = asyncio.get_running_loop().time() + deadline_s
    return asyncio.create_task(keep_alive(raws, ack_wait_s / 3, until))
