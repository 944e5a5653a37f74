"""`ckpt-ha up` starts a dead nats-server or redis-server where it was: the running services
hold its URL. (The real processes: tests/system/e2e/test_local_stack.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckpt_ha.lab.devstack import stack
from ckpt_ha.lab.devstack.procs import ManagedProcess, ProcessStartFailed
from ckpt_ha.runtime.local_stack import StackState

NATS = ManagedProcess(
    name="nats", pid=1, port=4333, url="nats://127.0.0.1:4333", log_path=Path("n"), http_port=8333
)


def recorded(*procs: ManagedProcess) -> StackState:
    return StackState(
        home=Path("/h"), nats_url=NATS.url, redis_url="", storage_root="/s", processes=procs
    )


def fake_start(taken: set[int]) -> tuple[list[int | None], object]:
    asked: list[int | None] = []

    def start(at: ManagedProcess | None) -> ManagedProcess:
        asked.append(at.port if at else None)
        if at is not None and at.port in taken:
            raise ProcessStartFailed("nats", f"port 127.0.0.1:{at.port} is already in use", "")
        return at or dataclasses.replace(NATS, port=5000, url="nats://127.0.0.1:5000")

    return asked, start


def test_a_recorded_server_is_started_on_its_ports() -> None:
    asked, start = fake_start(taken=set())
    again = stack._restart("nats", recorded(NATS), ["registrar"], start)  # type: ignore[arg-type]
    assert asked == [4333]
    assert again.url == NATS.url


def test_a_new_stack_takes_fresh_ports() -> None:
    asked, start = fake_start(taken=set())
    stack._restart("nats", None, [], start)  # type: ignore[arg-type]
    stack._restart("nats", recorded(), [], start)  # type: ignore[arg-type]
    assert asked == [None, None]


def test_a_port_taken_meanwhile_fails_while_services_hold_the_url() -> None:
    asked, start = fake_start(taken={4333})
    with pytest.raises(ProcessStartFailed) as caught:
        stack._restart("nats", recorded(NATS), ["registrar", "janitor"], start)  # type: ignore[arg-type]
    assert "registrar, janitor still use nats://127.0.0.1:4333" in str(caught.value)
    assert "`ckpt-ha down` then `ckpt-ha up`" in str(caught.value)
    # With no service running, nothing holds the URL: fresh ports are fine.
    again = stack._restart("nats", recorded(NATS), [], start)  # type: ignore[arg-type]
    assert asked == [4333, 4333, None]
    assert again.port == 5000
