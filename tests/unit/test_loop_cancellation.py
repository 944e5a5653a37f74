"""A periodic loop stops when cancelled, even when a call inside a round lost the cancellation
(`ckpt_ha.runtime.leader.next_round`). CPython 3.11's ``asyncio.wait_for``, under nats-py's and
redis-py's calls, returns its result when the cancellation arrives as that result does: a loop
that only slept between rounds then ran on, and whoever awaited it (a service stopping, a lost
lease, a test's teardown) waited forever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from ckpt_ha.runtime.leader import next_round


async def losing_round() -> None:
    """A round whose call loses the cancellation, as CPython 3.11's ``wait_for`` does when it
    arrives with the result (written out here, so that it happens on every interpreter)."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.05)


def periodic(
    pause: Callable[[float], Awaitable[None]], rounds: list[int]
) -> Callable[[], Awaitable[None]]:
    """A loop whose first round loses the cancellation; the later rounds keep theirs."""

    async def run() -> None:
        while True:
            rounds.append(1)
            if len(rounds) == 1:
                await losing_round()
            else:
                await asyncio.sleep(0.05)
            await pause(0.01)

    return run


async def cancel_after_first_round(run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    task = asyncio.create_task(run())
    await asyncio.sleep(0)  # the round starts and waits for its call
    task.cancel()  # lost by the round
    return task


async def test_a_loop_that_lost_its_cancellation_stops_at_its_next_round() -> None:
    rounds: list[int] = []
    task = await cancel_after_first_round(periodic(next_round, rounds))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert task.cancelled()
    assert rounds == [1]


async def test_with_a_plain_sleep_the_same_loop_runs_on() -> None:
    """The control: what `next_round` prevents."""
    rounds: list[int] = []
    task = await cancel_after_first_round(periodic(asyncio.sleep, rounds))
    await asyncio.sleep(0.2)
    assert not task.done()
    assert len(rounds) > 1
    task.cancel()  # a second request, delivered while it sleeps
    with pytest.raises(asyncio.CancelledError):
        await task
