"""Loop leases on a real Redis: one replica runs a periodic loop, another takes it over when the
holder stops (at once) or dies (when the lease expires); only the holder renews or releases."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from ckpt_ha.registry.client import connect
from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.runtime.leader import Leader, Loop
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.bus_tools import wait_for

pytestmark = pytest.mark.integration

TTL_S = 0.6


@pytest.fixture
async def client(settings: ServiceSettings) -> AsyncIterator[aioredis.Redis]:
    found = connect(settings.redis())
    yield found
    await found.aclose()


def leader(leases: RedisLeases, replica: str) -> Leader:
    metrics = ServiceMetrics("svc", CollectorRegistry())
    return Leader(leases, metrics, "rounds", TTL_S, replica=replica)


def leading(lead: Leader) -> float | None:
    return lead.metrics.registry.get_sample_value(
        "ckpt_ha_loop_leader", {"service": "svc", "loop": "rounds", "replica": lead.replica}
    )


async def test_only_the_holder_renews_or_releases(
    client: aioredis.Redis, settings: ServiceSettings
) -> None:
    leases = RedisLeases(client, settings.registry_prefix)
    assert await leases.take("scan", "a", 5)
    assert await leases.take("scan", "a", 5)  # renewed by its holder
    assert not await leases.take("scan", "b", 5)
    assert not await leases.release("scan", "b")
    assert await leases.holder("scan") == "a"
    assert await leases.release("scan", "a")
    assert await leases.holder("scan") is None
    assert await leases.take("scan", "b", 5)


async def test_one_replica_runs_the_loop_and_the_other_takes_it_over(
    client: aioredis.Redis, settings: ServiceSettings
) -> None:
    leases = RedisLeases(client, settings.registry_prefix)
    ran: list[str] = []

    def rounds(replica: str) -> Loop:
        async def loop() -> None:
            while True:
                ran.append(replica)
                await asyncio.sleep(0.02)

        return loop

    a, b = leader(leases, "a"), leader(leases, "b")
    tasks = {lead.replica: asyncio.create_task(lead.run(rounds(lead.replica))) for lead in (a, b)}
    try:
        await wait_for(lambda: _true(len(ran) >= 20), timeout=5, what="rounds")
        first = ran[0]
        assert set(ran) == {first}, "two replicas ran the loop at once"
        holder, other = (a, b) if first == "a" else (b, a)
        assert (leading(holder), leading(other)) == (1, 0)
        assert await leases.holder("svc:rounds") == first
        # Renewed past several lifetimes: still one holder.
        await asyncio.sleep(TTL_S * 3)
        assert set(ran) == {first}

        # The holder stops (a shutdown): it gives the lease up; the other takes it at its next
        # try, within a third of the lifetime.
        stopped = time.monotonic()
        tasks[first].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[first]
        assert leading(holder) == 0
        await wait_for(lambda: _true(other.replica in ran), timeout=5, what="the takeover")
        assert time.monotonic() - stopped < TTL_S
        assert leading(other) == 1
    finally:
        for task in tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_dead_holders_loop_is_taken_over_once_its_lease_expires(
    client: aioredis.Redis, settings: ServiceSettings
) -> None:
    """A holder killed without a word (here: a lease taken by a replica that never renews)."""
    leases = RedisLeases(client, settings.registry_prefix)
    assert await leases.take("svc:rounds", "killed", TTL_S)
    taken = time.monotonic()
    ran: list[float] = []

    async def loop() -> None:
        ran.append(time.monotonic())
        await asyncio.Event().wait()

    b = leader(leases, "b")
    task = asyncio.create_task(b.run(loop))
    try:
        await wait_for(lambda: _true(bool(ran)), timeout=5, what="the takeover")
        waited = ran[0] - taken
        assert TTL_S * 0.9 <= waited < TTL_S * 2, waited
        assert await leases.holder("svc:rounds") == "b"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert await leases.holder("svc:rounds") is None  # given up on shutdown


async def _true(value: bool) -> bool:
    return value
