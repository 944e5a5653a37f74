"""The real adapters of the registry, watch-state and publisher ports pass the same contract
suites as the in-memory fakes (`tests/unit/test_port_fakes.py`): Redis on a unique prefix, NATS
on the test's private stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import CATALOG, Envelope, EventData
from ckpt_ha.registry.port import RegistryUnavailable
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.writer_watcher.adapters import RedisWatchState, state_key
from ckpt_ha.writer_watcher.domain import WatchState
from ckpt_ha.writer_watcher.ports import WatchStateUnavailable
from tests.support.bus_tools import stream_messages
from tests.support.publisher_contract import PublisherContract, Stored
from tests.support.registry_contract import RegistryContract
from tests.support.watch_state_contract import ROOT, OpenState, WatchStateContract, tracked

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


class TestRedisRegistry(RegistryContract):
    @pytest.fixture
    async def registry(self, settings: ServiceSettings) -> AsyncIterator[Registry]:
        registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
        yield registry
        await registry.close()


class TestRedisWatchState(WatchStateContract):
    @pytest.fixture
    async def open_state(self, settings: ServiceSettings) -> AsyncIterator[OpenState]:
        opened: list[RedisWatchState] = []

        def open_state(root_uri: str) -> RedisWatchState:
            opened.append(RedisWatchState.from_url(settings.redis_url, settings.registry_prefix,
                                                   root_uri))  # fmt: skip
            return opened[-1]

        yield open_state
        for state in opened:
            await state.close()


class TestBusPublisher(PublisherContract):
    @pytest.fixture
    async def publisher(self, settings: ServiceSettings) -> AsyncIterator[Bus]:
        bus = Bus(settings.bus(), "test-publisher")
        await bus.broker.start()
        yield bus
        await bus.broker.stop()

    @pytest.fixture
    def stored(self, settings: ServiceSettings) -> Stored:
        async def events() -> list[Envelope[EventData]]:
            msgs = await stream_messages(settings.nats_url, settings.events_stream)
            return [CATALOG.decode(m.data) for m in msgs]

        return events


async def test_an_unreadable_watch_state_entry_is_dropped_not_fatal(
    settings: ServiceSettings,
) -> None:
    r = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        await r.hset(state_key(settings.registry_prefix, ROOT), "job-1/broken", "{not json")
        store = RedisWatchState(r, settings.registry_prefix, ROOT)
        await store.save(WatchState({"job-1/ok": tracked("c1")}))
        assert set((await store.load()).folders) == {"job-1/ok"}
    finally:
        await r.aclose()


async def test_an_unreachable_redis_is_a_transient_error_of_the_port() -> None:
    registry = Registry.from_url(NOWHERE, "nowhere")
    state = RedisWatchState.from_url(NOWHERE, "nowhere", ROOT)
    try:
        with pytest.raises(RegistryUnavailable):
            await registry.get("c1")
        with pytest.raises(RegistryUnavailable):
            await registry.by_job("job-1")
        with pytest.raises(WatchStateUnavailable):
            await state.load()
    finally:
        await registry.close()
        await state.close()
