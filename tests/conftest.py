"""Shared fixtures: the real NATS and Redis, and uniquely named streams, subjects and keys.

NATS and Redis are found through ``NATS_URL`` / ``REDIS_URL`` (``scripts/test`` exports them,
pointing at private servers it started when nothing listened on 4222 / 6379). A missing service
fails the test (never skips): under CI a skip would hide a broken set-up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlparse

import nats
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.integrity_checker.app import IntegrityChecker
from ckpt_ha.integrity_checker.app import build as build_checker
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.registry.client import SentinelUrl, is_sentinel
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import publisher
from ckpt_ha.writer_watcher import adapters as watcher_adapters
from tests.support.bus_tools import SIGNING_KEY
from tests.support.events import DATA_ROOT

pytest_plugins = [
    "pytester",
    "tests.support.private_infra",
    "tests.support.slurm",
    "tests.support.fast_tier",
]

NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def _require(url: str, what: str) -> None:
    if is_sentinel(url):  # any one of the sentinels answering will do
        addresses = list(SentinelUrl.parse(url).sentinels)
    else:
        parsed = urlparse(url)
        addresses = [(parsed.hostname or "", parsed.port or 0)]
    exc: OSError | None = None
    for address in addresses:
        try:
            with socket.create_connection(address, timeout=2):
                return
        except OSError as err:
            exc = err
    if exc is not None:
        pytest.fail(
            f"{what} is required at {url} and is not reachable ({exc}); run the tests through "
            "scripts/test, which starts private NATS and Redis when none answer"
        )


@pytest.fixture
def nats_url() -> str:
    _require(NATS_URL, "NATS")
    return NATS_URL


@pytest.fixture
def redis_url() -> str:
    _require(REDIS_URL, "Redis")
    return REDIS_URL


@pytest.fixture(autouse=True)
def _sdk_progress_publishers_closed() -> Iterator[None]:
    """Each test's SDK progress publishers are flushed and closed when it ends, so what one left
    queued is reported inside that test rather than at interpreter exit."""
    yield
    publisher.close_all()


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def prefixed_redis(redis_url: str, unique: str) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    """A Redis client and a key prefix of this test's own; its keys are deleted afterwards."""
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    prefix = f"test:{unique}"
    yield r, prefix
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*")]
    if keys:
        await r.delete(*keys)
    await r.aclose()


@pytest.fixture
async def settings(nats_url: str, redis_url: str, unique: str) -> AsyncIterator[ServiceSettings]:
    """Settings with a private subject prefix, streams and registry prefix; cleaned up after.
    The storage root is where `tests.support.events` puts its locations; a test that writes
    real bytes overrides it with its own root."""
    s = ServiceSettings(
        NATS_URL=nats_url,
        REDIS_URL=redis_url,
        subject_prefix=f"t{unique}",
        events_stream=f"EV_{unique}",
        dead_letter_stream=f"DLQ_{unique}",
        progress_stream=f"PR_{unique}",
        registry_prefix=f"test:{unique}",
        ack_wait_s=2.0,
        max_deliver=3,
        backoff_s=(0.2, 0.2, 0.2),
        fetch_batch=32,
        graceful_timeout_s=3.0,
        signing_key=SecretStr(SIGNING_KEY),
        storage_root=DATA_ROOT,
    )
    nc = await nats.connect(nats_url)
    await streams.provision(nc.jetstream(), s.bus())  # as the operator would, before services
    await nc.close()
    yield s
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for stream in (s.events_stream, s.dead_letter_stream, s.progress_stream):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    await nc.close()
    r = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in r.scan_iter(match=f"{s.registry_prefix}:*")]
    keys += [k async for k in r.scan_iter(match=watcher_adapters.state_keys(s.registry_prefix))]
    if keys:
        await r.delete(*keys)
    await r.aclose()


@pytest.fixture
async def registrar(settings: ServiceSettings) -> AsyncIterator[Registrar]:
    """The real registrar, in-process, consuming the test's private stream."""
    svc = build_registrar(RegistrarSettings.model_validate(settings.model_dump()))
    await svc.bus.broker.start()
    yield svc
    await svc.bus.broker.stop()
    await svc.registry.close()


@pytest.fixture
async def checker(settings: ServiceSettings) -> AsyncIterator[IntegrityChecker]:
    """The real integrity-checker, in-process, on the test's stream and storage root."""
    svc = build_checker(IntegrityCheckerSettings.model_validate(settings.model_dump()))
    await svc.bus.broker.start()
    yield svc
    await svc.bus.broker.stop()
    await svc.registry.close()


@pytest.fixture
async def coordinator(settings: ServiceSettings) -> AsyncIterator[RestoreCoordinator]:
    """The real restore-coordinator, in-process, on the test's stream."""
    svc = build_coordinator(RestoreCoordinatorSettings.model_validate(settings.model_dump()))
    await svc.bus.broker.start()
    yield svc
    await svc.bus.broker.stop()
    await svc.state.close()


@pytest.fixture
async def producer(settings: ServiceSettings) -> AsyncIterator[Bus]:
    """A bus to publish the test's events on its private subjects."""
    bus = Bus(settings.bus(), "test-producer")
    await bus.broker.start()
    yield bus
    await bus.broker.stop()
