"""The Redis owners of the coordinator's state (``<p>:coord:*``) and of the pins
(``<p>:pins:<job>``) against a real Redis, each test under its own prefix: the same contract
suites the in-memory fakes pass."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from ckpt_ha.core.restore_records import DecisionRecord, Pin, Started
from ckpt_ha.registry.pins import RedisPins
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.registry.restores import RedisRestores
from tests.support.pins_contract import PinsContract
from tests.support.restores_contract import T0, TRAJECTORY_LIMIT, RestoresContract, plan, point

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(redis_url: str, unique: str) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    prefix = f"test:{unique}"
    yield r, prefix
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*")]
    if keys:
        await r.delete(*keys)
    await r.aclose()


class TestRedisPins(PinsContract):
    @pytest.fixture
    def pins(self, client: tuple[aioredis.Redis, str]) -> RedisPins:
        return RedisPins(*client)


class TestRedisRestores(RestoresContract):
    @pytest.fixture
    def stores(self, client: tuple[aioredis.Redis, str]) -> tuple[RedisRestores, RedisPins]:
        pins = RedisPins(*client)
        return RedisRestores(*client, pins=pins, trajectory_limit=TRAJECTORY_LIMIT), pins


async def test_a_registry_rebuild_keeps_what_the_owners_write(
    client: tuple[aioredis.Redis, str],
) -> None:
    """Neither the coordinator's state nor the pins are a projection of the checkpoint stream:
    every key the owners write is one `Registry.clear` keeps (``NOT_REBUILT``)."""
    r, prefix = client
    state = RedisRestores(r, prefix)
    await state.record_decision(
        "job-a", 1, DecisionRecord(events=()), plan=plan("p1"),
        pins=[Pin("c-300", "restored from", "p1", 300, 2)],
    )  # fmt: skip
    await state.record_started("job-a", Started(run_id="r", attempt=2, at=T0))
    await state.record_progress("job-a", [point(1)], last=point(1))
    before = sorted([k async for k in r.scan_iter(match=f"{prefix}:*")])
    assert len(before) == 8
    assert await Registry(r, prefix).clear() == 0
    assert sorted([k async for k in r.scan_iter(match=f"{prefix}:*")]) == before
