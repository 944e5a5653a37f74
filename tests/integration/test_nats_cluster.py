"""A three-node JetStream cluster losing its stream leader mid-flow loses no event.

Three real nats-servers on loopback ports form a cluster; the real `ckpt-ha streams provision`
gives both streams three replicas; the registrar (in-process) and a writer (a `Bus` publishing
checkpoint events, as the writer-watcher does) are given all three servers in one URL. The node
leading the event stream is SIGKILLed while the writer publishes: every event published before
and after is applied (every checkpoint valid in the registry, no dead letter), because a publish
unanswered during the election is retried (`ckpt_ha.bus.publishing.publish_retrying`) and the
consumers carry on from the remaining replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.procs import ManagedProcess
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import SIGNING_KEY, stream_messages, wait_for
from tests.support.cli_tools import cli
from tests.support.events import DATA_ROOT, committed, verified

pytestmark = pytest.mark.integration

NODES = 3
BEFORE = 20
"""Checkpoints the writer publishes before the leader is killed (as many again after)."""


def _cluster_block(name: str, port: int, route_ports: list[int]) -> str:
    routes = ", ".join(f'"nats-route://{procs.LOCALHOST}:{p}"' for p in route_ports)
    listen = f"{procs.LOCALHOST}:{port}"
    return f'cluster {{\n  name: "{name}"\n  listen: {listen}\n  routes: [{routes}]\n}}'


@pytest.fixture
def cluster(tmp_path: Path, unique: str) -> Iterator[dict[str, ManagedProcess]]:
    """Three JetStream nodes named n1..n3, routed to each other; stopped at teardown."""
    route_ports = [procs.free_port() for _ in range(NODES)]
    nodes: dict[str, ManagedProcess] = {}
    try:
        for i in range(NODES):
            name = f"n{i + 1}"
            nodes[name] = procs.start_nats(
                tmp_path / name,
                server_name=name,
                config_extra=_cluster_block(f"c{unique}", route_ports[i], route_ports),
            )
        yield nodes
    finally:
        for proc in nodes.values():
            procs.stop(proc)


def _url(node: ManagedProcess) -> str:
    return f"nats://{procs.LOCALHOST}:{node.port}"


async def _jetstream_ready(url: str) -> bool:
    """The cluster has elected its meta leader: JetStream answers account info."""
    try:
        nc = await nats.connect(url, max_reconnect_attempts=1, connect_timeout=1)
    except (nats.errors.Error, OSError):
        return False
    try:
        await nc.jetstream(timeout=1).account_info()
    except (nats.errors.Error, OSError):
        return False
    finally:
        await nc.close()
    return True


@pytest.fixture
async def cluster_settings(
    cluster: dict[str, ManagedProcess], redis_url: str, unique: str
) -> AsyncIterator[ServiceSettings]:
    urls = ",".join(_url(p) for p in cluster.values())
    await wait_for(lambda: _jetstream_ready(urls.split(",")[0]), timeout=30, what="meta leader")
    yield ServiceSettings(
        NATS_URL=urls,
        REDIS_URL=redis_url,
        subject_prefix=f"t{unique}",
        events_stream=f"EV_{unique}",
        dead_letter_stream=f"DLQ_{unique}",
        progress_stream=f"PR_{unique}",
        registry_prefix=f"test:{unique}",
        stream_replicas=NODES,
        ack_wait_s=2.0,
        max_deliver=5,
        backoff_s=(0.2, 0.2, 0.2),
        fetch_batch=32,
        graceful_timeout_s=3.0,
        signing_key=SecretStr(SIGNING_KEY),
        storage_root=DATA_ROOT,
    )
    r = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in r.scan_iter(match=f"test:{unique}:*")]
    if keys:
        await r.delete(*keys)
    await r.aclose()


async def _leader(url: str, stream: str) -> str:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream(timeout=5).stream_info(stream)
    finally:
        await nc.close()
    assert info.cluster is not None
    assert info.cluster.leader is not None
    assert len(info.cluster.replicas or []) == NODES - 1, info.cluster
    return info.cluster.leader


async def test_killing_the_stream_leader_loses_no_event(
    cluster: dict[str, ManagedProcess], cluster_settings: ServiceSettings, tmp_path: Path
) -> None:
    s = cluster_settings
    # The operator's command, twice: creates the replicated streams, then finds them as required.
    replicas = {"CKPT_HA_STREAM_REPLICAS": str(NODES)}
    code, out, err = await cli(s, tmp_path / "home", "streams", "provision", env=replicas)
    assert code == 0, err
    assert f"{s.events_stream}: created" in out
    code, out, err = await cli(s, tmp_path / "home", "streams", "provision", env=replicas)
    assert code == 0, err
    assert f"{s.events_stream}: as required" in out
    assert f"{s.dead_letter_stream}: as required" in out
    first = s.bus().servers[0]
    leader = await _leader(first, s.events_stream)

    registrar = build_registrar(RegistrarSettings.model_validate(s.model_dump()))
    writer = Bus(s.bus(), "test-writer", lasting=True)
    await registrar.bus.broker.start()
    await writer.broker.start()
    try:
        after_kill: list[int] = []
        killed = asyncio.Event()
        mid_flow = asyncio.Event()

        async def publish(i: int) -> None:
            await writer.publish(committed(f"c{i}", step=i))
            await writer.publish(verified(f"c{i}", step=i))
            if killed.is_set():
                after_kill.append(i)
            if i == BEFORE + 2:
                mid_flow.set()

        for i in range(BEFORE):
            await publish(i)
        # Killed while the writer is mid-flow: the publishes racing the election must land.
        flow = asyncio.create_task(_publish_all(publish, range(BEFORE, 2 * BEFORE)))
        await asyncio.wait_for(mid_flow.wait(), timeout=30)
        procs.kill(cluster[leader])
        killed.set()
        await asyncio.wait_for(flow, timeout=60)
        assert after_kill, "the writer published nothing after the kill"
        survivor = next(_url(p) for name, p in cluster.items() if name != leader)
        assert await _leader(survivor, s.events_stream) != leader

        async def all_valid() -> bool:
            for i in range(2 * BEFORE):
                rec = await registrar.registry.get(f"c{i}")
                if rec is None or rec.state is not CheckpointState.VALID:
                    return False
            return True

        await wait_for(all_valid, timeout=60, what=f"{2 * BEFORE} checkpoints valid")
        letters: list[object] = []

        async def dead_letter_stream_answers() -> bool:
            # Nothing was written to it, so if its leader was the killed node its election may
            # still be under way (a request timing out): ask again until it answers.
            try:
                letters[:] = await stream_messages(survivor, s.dead_letter_stream)
            except nats.errors.TimeoutError:
                return False
            return True

        await wait_for(dead_letter_stream_answers, timeout=60, what="the dead-letter stream")
        assert letters == []
    finally:
        with contextlib.suppress(Exception):
            await writer.broker.stop()
        await registrar.bus.broker.stop()
        await registrar.registry.close()


async def _publish_all(publish: Callable[[int], Awaitable[None]], ids: range) -> None:
    for i in ids:
        await publish(i)
