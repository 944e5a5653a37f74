"""Fixtures for tests that need a nats-server or Redis of their own (to pause, kill, restart).

Register them all with ``pytest_plugins = ["tests.support.private_infra"]`` (in the test module
or in ``tests/conftest.py``), or import the ones you use::

    from tests.support.private_infra import private_nats  # noqa: F401

(ruff then flags every test parameter named like an imported fixture as F811.)

A test that restarts a server starts it again in the same home (``private_nats_home`` /
``private_redis_home``, or ``nats_home(tmp_path)`` / ``redis_home(tmp_path)``), so JetStream data or
the AOF is found again, and hands the new instance to the ``process_janitor`` fixture so it is
stopped at teardown. Nothing here skips: a missing binary fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_ha.lab.devstack.procs import ManagedProcess, start_nats, start_redis, stop


class ProcessJanitor:
    """Stops every process handed to it when the test ends, newest first."""

    def __init__(self) -> None:
        self._procs: list[ManagedProcess] = []

    def track(self, proc: ManagedProcess) -> ManagedProcess:
        self._procs.append(proc)
        return proc

    def stop_all(self) -> None:
        errors: list[Exception] = []
        while self._procs:
            try:
                stop(self._procs.pop())
            except Exception as exc:  # noqa: BLE001 - stop the rest first, then report
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def process_janitor() -> Iterator[ProcessJanitor]:
    janitor = ProcessJanitor()
    yield janitor
    janitor.stop_all()


def nats_home(tmp_path: Path) -> Path:
    """Where ``private_nats`` keeps its config, JetStream store and log for this test."""
    return tmp_path / "private-nats"


def redis_home(tmp_path: Path) -> Path:
    """Where ``private_redis`` keeps its AOF and log for this test."""
    return tmp_path / "private-redis"


@pytest.fixture
def private_nats_home(tmp_path: Path) -> Path:
    return nats_home(tmp_path)


@pytest.fixture
def private_redis_home(tmp_path: Path) -> Path:
    return redis_home(tmp_path)


# The two server fixtures depend on nothing but pytest's own tmp_path, so importing just the one
# fixture a test uses is enough.


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[ManagedProcess]:
    """A JetStream-enabled nats-server on free ports, stopped (even if paused) at teardown."""
    proc = start_nats(nats_home(tmp_path))
    yield proc
    stop(proc)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[ManagedProcess]:
    """An AOF-persisted redis-server on a free port, stopped (even if paused) at teardown."""
    proc = start_redis(redis_home(tmp_path))
    yield proc
    stop(proc)
