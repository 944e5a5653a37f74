"""The registrar on a Redis watched by three sentinels: the master is SIGKILLed mid-flow, the
services carry on against the promoted replica, and what the failover lost (writes the replica
never received: replication is asynchronous) comes back from the stream with `registry rebuild`.

Real processes on free loopback ports: a master, a replica and three sentinels (the redis-server
``scripts/bootstrap`` installs, in sentinel mode), with small sentinel timeouts so the failover
takes a few seconds. The loss is made certain, not left to timing: the replica logs in to the
master as its own ACL user, which is switched off (and its link cut) before the second batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.procs import ManagedProcess
from ckpt_ha.registrar.app import Registrar, build
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.registry.port import RegistryUnavailable
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import wait_for
from tests.support.cli_tools import cli
from tests.support.events import committed, verified

pytestmark = pytest.mark.integration

SERVICE = "registry"
URL_SECRET = "url-secret-1234"
REPLICATION = ("replication", "replication-secret")
ACL = (
    f"user default on nopass ~* &* +@all\nuser {REPLICATION[0]} on >{REPLICATION[1]} ~* &* +@all\n"
)


@dataclass(frozen=True)
class SentinelSet:
    master: ManagedProcess
    replica: ManagedProcess
    sentinels: Sequence[ManagedProcess]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{procs.LOCALHOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"


async def _info(port: int, section: str) -> dict[str, str]:
    r = aioredis.Redis(host=procs.LOCALHOST, port=port, decode_responses=True)
    try:
        return {k: str(v) for k, v in (await r.info(section)).items()}
    finally:
        await r.aclose()


async def _sentinel_view(port: int) -> dict[str, str]:
    r = aioredis.Redis(host=procs.LOCALHOST, port=port, decode_responses=True)
    try:
        # The reply of SENTINEL MASTER is a flat field/value list.
        flat = await r.execute_command("SENTINEL", "MASTER", SERVICE)
        if isinstance(flat, dict):
            return {str(k): str(v) for k, v in flat.items()}
        return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}
    finally:
        await r.aclose()


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    started: list[ManagedProcess] = []
    try:
        master = procs.start_redis(tmp_path / "master", acl=ACL)
        started.append(master)
        replica = procs.start_redis(
            tmp_path / "replica", replica_of=master.port, master_login=REPLICATION
        )
        started.append(replica)
        sentinels = []
        for i in range(3):
            sentinel = procs.start_sentinel(
                tmp_path / f"sentinel-{i}",
                master_port=master.port,
                service=SERVICE,
                quorum=2,
                down_after_ms=1000,
                failover_timeout_ms=3000,
            )
            started.append(sentinel)
            sentinels.append(sentinel)
        yield SentinelSet(master, replica, tuple(sentinels))
    finally:
        for proc in reversed(started):
            if procs.is_alive(proc):
                procs.stop(proc)


async def _ready(cluster: SentinelSet) -> None:
    """The replica in sync and every sentinel knowing the replica and the two other sentinels
    (they find each other through the master's hello channel, every 2 s)."""

    async def synced() -> bool:
        return (await _info(cluster.replica.port, "replication")).get("master_link_status") == "up"

    await wait_for(synced, timeout=20, what="the replica in sync")

    async def agreed() -> bool:
        for sentinel in cluster.sentinels:
            view = await _sentinel_view(sentinel.port)
            if view.get("num-other-sentinels") != "2" or view.get("num-slaves") != "1":
                return False
        return True

    await wait_for(agreed, timeout=30, what="three sentinels that know the replica")


async def _all_valid(registry: Registry, ids: Sequence[str]) -> bool:
    """Every one VALID; False while the registry is unreachable (the failover under way)."""
    try:
        for ckpt in ids:
            rec = await registry.get(ckpt)
            if rec is None or rec.state is not CheckpointState.VALID:
                return False
    except RegistryUnavailable:
        return False
    return True


async def _publish(producer: Bus, ids: Sequence[str], first_step: int) -> None:
    for i, ckpt in enumerate(ids):
        await producer.publish(committed(ckpt, step=first_step + i))
        await producer.publish(verified(ckpt, step=first_step + i))


async def test_failover_keeps_services_running_and_rebuild_restores_what_it_lost(
    sentinel_set: SentinelSet, settings: ServiceSettings, tmp_path: Path
) -> None:
    await _ready(sentinel_set)
    # Redeliveries that outlast a failover (a few seconds), as the production defaults do.
    over_sentinel = settings.model_copy(
        update={"redis_url": sentinel_set.url, "max_deliver": 20, "backoff_s": (0.5, 1.0)}
    )
    registrar: Registrar = build(RegistrarSettings.model_validate(over_sentinel.model_dump()))
    producer = Bus(settings.bus(), "test-writer")
    on_replica = Registry.from_url(sentinel_set.replica.url, settings.registry_prefix)
    before = [f"before-{i}" for i in range(3)]
    lost = [f"lost-{i}" for i in range(3)]
    after = [f"after-{i}" for i in range(3)]
    await registrar.bus.broker.start()
    await producer.broker.start()
    try:
        await _publish(producer, before, 100)
        await wait_for(lambda: _all_valid(registrar.registry, before), what="first batch")
        await wait_for(lambda: _all_valid(on_replica, before), what="first batch replicated")

        # The replica stops receiving: what the master takes from now on exists only there.
        master = aioredis.Redis(host=procs.LOCALHOST, port=sentinel_set.master.port)
        await master.execute_command("ACL", "SETUSER", REPLICATION[0], "off")
        await master.execute_command("CLIENT", "KILL", "USER", REPLICATION[0])
        await master.aclose()

        await _publish(producer, lost, 200)
        await wait_for(lambda: _all_valid(registrar.registry, lost), what="second batch")
        assert [await on_replica.get(c) for c in lost] == [None] * len(lost)

        procs.kill(sentinel_set.master)  # SIGKILL, mid-flow
        await _publish(producer, after, 300)
        await wait_for(
            lambda: _all_valid(registrar.registry, after), timeout=60, what="after failover"
        )
        promoted = await _info(sentinel_set.replica.port, "replication")
        assert promoted["role"] == "master"
        # Served by the promoted replica, which never had the second batch: lost in failover.
        assert await _all_valid(on_replica, [*before, *after])
        assert [await registrar.registry.get(c) for c in lost] == [None] * len(lost)
    finally:
        await producer.broker.stop()
        await registrar.bus.broker.stop()

    # The registry is an index of the stream: rebuilt through the sentinels, nothing is lost.
    # (The URL's login goes to the data nodes; their default user takes any password.)
    with_login = sentinel_set.url.replace("://", f"://default:{URL_SECRET}@")
    code, out, err = await _cli(
        over_sentinel, tmp_path, with_login, "registry", "rebuild", "--clear", "--yes"
    )
    assert code == 0, err
    assert "skipped none" in out
    assert await _all_valid(on_replica, [*before, *lost, *after])
    await on_replica.close()

    # No sentinel answers: one line naming the URL, its password replaced.
    gone = f"redis+sentinel://default:{URL_SECRET}@{procs.LOCALHOST}:{procs.free_port()}/{SERVICE}"
    code, out, err = await _cli(over_sentinel, tmp_path, gone, "checkpoints", "list", "--job", "j")
    assert code == 3
    assert "cannot reach Redis at redis+sentinel://default:***@" in err
    assert f"No master found for '{SERVICE}' (no sentinel answered" in err
    assert len(err.strip().splitlines()) == 1
    assert URL_SECRET not in out + err


async def _cli(
    settings: ServiceSettings, tmp_path: Path, url: str, *args: str
) -> tuple[int, str, str]:
    env = {"REDIS_URL": url, "CKPT_HA_STORAGE_ROOT": settings.storage_root}
    return await cli(settings, tmp_path / "home", *args, env=env)
