"""The test command's brokers (ckpt_ha.lab.devstack.testinfra), with real nats-server and Redis.

The probed ports are pointed at ports nobody listens on (or at a private server), so these tests
never depend on, or touch, the shared services on 4222 / 6379.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import nats
import pytest
import redis

from ckpt_ha.lab.devstack import testinfra
from ckpt_ha.lab.devstack.procs import ManagedProcess, accepts_tcp, free_port, is_alive

if TYPE_CHECKING:
    from tests.support.private_infra import ProcessJanitor

pytest_plugins = ["tests.support.private_infra"]
pytestmark = pytest.mark.integration


def _closed_ports() -> dict[str, str]:
    """Probe ports with nothing behind them, and no URLs: everything must be started."""
    return {
        "CKPT_HA_TEST_PROBE_NATS_PORT": str(free_port()),
        "CKPT_HA_TEST_PROBE_REDIS_PORT": str(free_port()),
    }


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def test_nothing_listening_starts_private_ones_and_down_stops_them(
    tmp_path: Path, process_janitor: ProcessJanitor
) -> None:
    home = tmp_path / "infra"
    lines: list[str] = []
    exports = testinfra.up(home, _closed_ports(), lines.append)
    recorded = [
        ManagedProcess.from_dict(d) for d in json.loads((home / "testinfra.json").read_text())
    ]
    for proc in recorded:
        process_janitor.track(proc)  # stopped even if an assertion below fails
    assert sorted(p.name for p in recorded) == ["nats", "redis"]
    assert exports["NATS_URL"] == next(p.url for p in recorded if p.name == "nats")
    assert exports["REDIS_URL"] == next(p.url for p in recorded if p.name == "redis")
    assert all("started a private one" in line for line in lines)

    nc = await nats.connect(exports["NATS_URL"])
    info = await nc.jetstream().account_info()  # JetStream is on
    await nc.close()
    assert info.streams == 0
    client = redis.Redis.from_url(exports["REDIS_URL"])
    assert client.ping()
    client.close()

    assert [p.pid for p in testinfra.down(home)] == [p.pid for p in recorded]
    assert not any(is_alive(p) for p in recorded)
    assert not accepts_tcp(_port(exports["NATS_URL"]))
    assert not accepts_tcp(_port(exports["REDIS_URL"]))
    assert testinfra.down(home) == []  # idempotent: the record is gone


def test_given_urls_and_listening_ports_start_nothing(
    tmp_path: Path, private_redis: ManagedProcess
) -> None:
    env = {
        "NATS_URL": "nats://example.invalid:4222",
        "CKPT_HA_TEST_PROBE_NATS_PORT": str(free_port()),
        "CKPT_HA_TEST_PROBE_REDIS_PORT": str(private_redis.port),
    }
    exports = testinfra.up(tmp_path / "infra", env)
    assert exports == {
        "NATS_URL": "nats://example.invalid:4222",
        "REDIS_URL": f"redis://127.0.0.1:{private_redis.port}/0",
    }
    assert json.loads((tmp_path / "infra" / "testinfra.json").read_text()) == []
    assert testinfra.down(tmp_path / "infra") == []
    assert is_alive(private_redis)  # never stops what it did not start


def test_the_command_line_prints_exports_for_the_shell(
    tmp_path: Path, process_janitor: ProcessJanitor
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
    home = tmp_path / "infra"
    up = subprocess.run(
        [sys.executable, "-m", "ckpt_ha.lab.devstack.testinfra", "up", str(home)],
        env={**env, **_closed_ports()},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    for data in json.loads((home / "testinfra.json").read_text()):
        process_janitor.track(ManagedProcess.from_dict(data))
    assert up.returncode == 0, up.stderr
    exported = dict(
        shlex.split(line)[1].split("=", 1) for line in up.stdout.splitlines() if line.strip()
    )
    assert set(exported) == {"NATS_URL", "REDIS_URL"}
    assert all(accepts_tcp(_port(url)) for url in exported.values())

    down = subprocess.run(
        [sys.executable, "-m", "ckpt_ha.lab.devstack.testinfra", "down", str(home)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert down.returncode == 0, down.stderr
    assert down.stdout == down.stderr == ""  # quiet: pytest's summary stays the last line
    assert not any(accepts_tcp(_port(url)) for url in exported.values())


def test_usage_errors_exit_2() -> None:
    assert testinfra.main(["sideways", "/tmp/x"]) == 2
    assert testinfra.main(["up"]) == 2
