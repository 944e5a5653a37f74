"""A fetch timeout must reach faststream as the nats error it catches, or a batch is dropped."""

from __future__ import annotations

import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from ckpt_ha.bus.broker import Bus, nats_timeouts
from ckpt_ha.bus.config import BusConfig


async def test_a_bare_timeout_becomes_the_nats_timeout() -> None:
    async def bare(batch: int = 1, timeout: float | None = None) -> list[Msg]:
        raise TimeoutError  # what nats-py raises when its deadline passes between requests

    with pytest.raises(nats.errors.TimeoutError):
        await nats_timeouts(bare)(5, timeout=0.1)


async def test_results_and_nats_errors_pass_unchanged() -> None:
    sentinel = nats.errors.TimeoutError()

    async def nats_timeout() -> list[Msg]:
        raise sentinel

    async def fetched() -> list[Msg]:
        return []

    with pytest.raises(nats.errors.TimeoutError) as caught:
        await nats_timeouts(nats_timeout)()
    assert caught.value is sentinel
    assert await nats_timeouts(fetched)() == []


def test_building_buses_installs_it_once() -> None:
    Bus(BusConfig(url="nats://127.0.0.1:1"), "a")
    Bus(BusConfig(url="nats://127.0.0.1:1"), "b")
    fetch = JetStreamContext.PullSubscription.fetch
    assert getattr(fetch, "ckpt_nats_timeouts", False)
    assert not getattr(fetch.__wrapped__, "ckpt_nats_timeouts", False)  # not wrapped twice
