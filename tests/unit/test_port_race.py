"""A lost bind race is retried only when we chose the port."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_ha.lab.devstack.procs import ManagedProcess, ProcessStartFailed, retry_port_race

PROC = ManagedProcess(name="x", pid=1, port=1, url="u", log_path=Path("/dev/null"))


def flaky(failures: list[str], reason: str = "exited with code 1"):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    def start() -> ManagedProcess:
        calls.append(1)
        if failures:
            raise ProcessStartFailed("x", reason, failures.pop(0))
        return PROC

    return start, calls


def test_lost_race_is_retried_with_fresh_ports() -> None:
    start, calls = flaky(["bind: address already in use"])
    assert retry_port_race(start, ports_chosen_here=True) is PROC
    assert len(calls) == 2


def test_a_port_found_taken_before_the_start_is_a_lost_race_too() -> None:
    start, calls = flaky([""], reason="port 127.0.0.1:4711 is already in use")
    assert retry_port_race(start, ports_chosen_here=True) is PROC
    assert len(calls) == 2


def test_a_port_the_caller_chose_is_not_retried() -> None:
    start, calls = flaky(["bind: address already in use"])
    with pytest.raises(ProcessStartFailed):
        retry_port_race(start, ports_chosen_here=False)
    assert len(calls) == 1


def test_other_failures_are_not_retried_and_retries_are_bounded() -> None:
    start, calls = flaky(["config error"])
    with pytest.raises(ProcessStartFailed, match="exited"):
        retry_port_race(start, ports_chosen_here=True)
    assert len(calls) == 1
    start, calls = flaky(["Address already in use"] * 5)
    with pytest.raises(ProcessStartFailed):
        retry_port_race(start, ports_chosen_here=True, attempts=3)
    assert len(calls) == 3
