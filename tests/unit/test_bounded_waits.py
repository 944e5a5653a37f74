"""Bounded waits, without a server: the reconnect policy, the handler deadline, the Redis client
options and storage calls that give up on a hung filesystem (a FIFO nobody writes to)."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from ckpt_ha.bus.config import SHORT_RECONNECT_ATTEMPTS, BusConfig
from ckpt_ha.bus.deadline import HandlerDeadlineExceeded, keep_alive, within_deadline
from ckpt_ha.bus.reconnect import ReconnectBackoff
from ckpt_ha.core.errors import TransientError
from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore, StorageUnavailable, bounded
from ckpt_ha.storage.bounded import StorageTimeout


def server(name: str, reconnects: int) -> Any:
    return SimpleNamespace(uri=name, reconnects=reconnects)


def test_reconnect_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    backoff = ReconnectBackoff(1.0, 30.0, rng=random.Random(7))
    for failed, full in [(0, 1.0), (1, 2.0), (2, 4.0), (4, 16.0), (5, 30.0), (60, 30.0)]:
        for _ in range(20):
            assert full / 2 <= backoff.wait(failed) <= full, failed
    assert ReconnectBackoff(1.0, 30.0, jitter=0).wait(10_000) == 30.0
    with pytest.raises(ValueError, match="first_s <= max_s"):
        ReconnectBackoff(5.0, 1.0)


def test_reconnect_backoff_tries_the_least_tried_server_and_counts_attempts() -> None:
    backoff = ReconnectBackoff(0.5, 4.0, jitter=0)
    chosen, wait = backoff([server("a", 3), server("b", 1), server("c", 2)], {})
    assert (chosen.uri, wait) == ("b", 1.0)
    for _ in range(100):  # nats-py's default would have stopped after 60
        chosen, wait = backoff([server("a", 100)], {})
    assert (chosen.uri, wait, backoff.attempts) == ("a", 4.0, 101)


def test_services_reconnect_forever_and_commands_give_up() -> None:
    cfg = BusConfig(reconnect_wait_s=0.5, reconnect_wait_max_s=8.0, ping_interval_s=3.0)
    lasting = cfg.connection_policy(lasting=True)
    assert lasting["max_reconnect_attempts"] == -1  # never stop (nats-py: a negative count)
    assert lasting["allow_reconnect"] is True
    handler = lasting["reconnect_to_server_handler"]
    assert isinstance(handler, ReconnectBackoff)
    assert (handler.first_s, handler.max_s) == (0.5, 8.0)
    assert (lasting["ping_interval"], lasting["max_outstanding_pings"]) == (3.0, 2)
    assert lasting["connect_timeout"] == cfg.connect_timeout_s
    # Each lasting connection counts its own attempts.
    assert cfg.connection_policy(lasting=True)["reconnect_to_server_handler"] is not handler
    short = cfg.connection_policy(lasting=False)
    assert short["max_reconnect_attempts"] == SHORT_RECONNECT_ATTEMPTS > 0
    assert "reconnect_to_server_handler" not in short
    with pytest.raises(ValueError, match="reconnect_wait_s"):
        BusConfig(reconnect_wait_s=10.0, reconnect_wait_max_s=1.0)


def test_settings_carry_every_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "CKPT_HA_HANDLER_DEADLINE_S": "42",
        "CKPT_HA_NATS_RECONNECT_WAIT_S": "0.25",
        "CKPT_HA_NATS_RECONNECT_WAIT_MAX_S": "9",
        "CKPT_HA_NATS_PING_INTERVAL_S": "4",
        "CKPT_HA_NATS_REQUEST_TIMEOUT_S": "3",
        "CKPT_HA_REDIS_TIMEOUT_S": "1.5",
        "CKPT_HA_REDIS_CONNECT_TIMEOUT_S": "2.5",
        "CKPT_HA_REDIS_RETRIES": "7",
        "CKPT_HA_STORAGE_TIMEOUT_S": "60",
    }.items():
        monkeypatch.setenv(name, value)
    settings = ServiceSettings()
    bus = settings.bus()
    assert (bus.handler_deadline_s, bus.reconnect_wait_s, bus.reconnect_wait_max_s) == (42, 0.25, 9)
    assert (bus.ping_interval_s, bus.request_timeout_s) == (4, 3)
    redis = settings.redis()
    assert (redis.timeout_s, redis.connect_timeout_s, redis.retries) == (1.5, 2.5, 7)
    assert settings.storage_timeout_s == 60
    defaults = ServiceSettings.model_construct()
    assert defaults.handler_deadline_s >= 10 * defaults.ack_wait_s  # generous


async def test_the_redis_client_bounds_every_command_and_retries_connection_errors() -> None:
    import redis.exceptions

    cfg = RedisConfig("redis://127.0.0.1:6379/0", user="u", password=SecretStr("p"))
    client = connect(RedisConfig("redis://h:1/0", timeout_s=1.5, connect_timeout_s=2.5, retries=4))
    conn = client.connection_pool.make_connection()
    assert (conn.socket_timeout, conn.socket_connect_timeout) == (1.5, 2.5)
    assert conn.retry.get_retries() == 4
    # A connection error is retried on a new connection; a timeout (the command may have run)
    # is not: the handler fails and the bus retries it as a whole.
    assert conn.retry_on_error == [redis.exceptions.ConnectionError]
    assert redis.exceptions.TimeoutError not in conn.retry._supported_errors
    await client.aclose()
    assert cfg.timeout_s == 5.0  # the default bound
    with pytest.raises(ValueError, match="timeouts must be positive"):
        RedisConfig("redis://h/0", timeout_s=0)


async def test_a_handler_past_its_deadline_is_cancelled_and_reported_transient() -> None:
    cancelled = asyncio.Event()

    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(HandlerDeadlineExceeded) as caught:
        await within_deadline(hangs(), 0.05)
    assert cancelled.is_set()
    assert isinstance(caught.value, TransientError)
    assert caught.value.code == "handler_deadline"
    assert "0.05s" in str(caught.value)

    async def own_timeout() -> None:
        raise TimeoutError("the handler's own")

    with pytest.raises(TimeoutError, match="the handler's own"):
        await within_deadline(own_timeout(), 5)
    assert await within_deadline(asyncio.sleep(0, result="done"), 5) == "done"


class _Msg:
    def __init__(self) -> None:
        self.is_acked = False
        self.progress = 0
        self.thrice = asyncio.Event()

    async def in_progress(self) -> None:
        self.progress += 1
        if self.progress >= 3:
            self.thrice.set()


async def test_in_progress_acks_stop_at_the_deadline() -> None:
    msg = _Msg()
    loop = asyncio.get_running_loop()
    # Until cancelled, in-progress acks go out every interval...
    task = asyncio.create_task(keep_alive([msg], 0.01, loop.time() + 60))  # type: ignore[list-item]
    await asyncio.wait_for(msg.thrice.wait(), 5)
    task.cancel()
    await task
    # ...and never past the deadline: keep_alive returns by itself there.
    late = _Msg()
    await asyncio.wait_for(keep_alive([late], 0.01, loop.time() + 0.1), 5)  # type: ignore[list-item]
    sent = late.progress
    assert 1 <= sent <= 10
    await asyncio.sleep(0.05)
    assert late.progress == sent


@pytest.fixture
def storage_pool() -> Iterator[None]:
    """A small storage pool for the test; the process default again afterwards."""
    bounded.configure(timeout_s=5, workers=2)
    yield
    bounded.configure(timeout_s=bounded.DEFAULT_TIMEOUT_S, workers=bounded.DEFAULT_WORKERS)


@pytest.mark.usefixtures("storage_pool")
async def test_a_hung_filesystem_call_times_out_and_the_loop_stays_free(tmp_path: Path) -> None:
    # A FIFO nobody writes to: open(2) blocks in the kernel, as on a hung mount.
    os.mkfifo(tmp_path / "stuck")
    store = FsStore(tmp_path)
    (tmp_path / "fine").write_bytes(b"ok")
    started = time.monotonic()
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(ticking())
    with pytest.raises(StorageTimeout) as caught:
        await bounded.call(store.read_bytes, "stuck", timeout_s=0.3)
    ticker.cancel()
    assert 0.3 <= time.monotonic() - started < 5
    assert ticks >= 10  # the event loop ran meanwhile
    assert isinstance(caught.value, StorageUnavailable)
    assert caught.value.transient
    assert "read_bytes did not return within 0.3s" in str(caught.value)
    # The other worker still serves; the stuck one is counted until the mount answers.
    assert await bounded.call(store.read_bytes, "fine") == b"ok"
    with pytest.raises(StorageTimeout, match=r"2 storage call\(s\) still running"):
        await bounded.call(store.read_bytes, "stuck", timeout_s=0.2)
    # Both workers stuck: a further call waits in line, gives up the same way, never runs.
    ran = threading.Event()
    with pytest.raises(StorageTimeout, match=r"2 storage call\(s\) still running"):
        await bounded.call(ran.set, timeout_s=0.2)
    # The mount answers: a writer opens the FIFO (both stuck readers return) and leaves.
    os.close(os.open(tmp_path / "stuck", os.O_WRONLY | os.O_NONBLOCK))
    assert await bounded.call(store.read_bytes, "fine") == b"ok"
    assert not ran.is_set()


@pytest.mark.usefixtures("storage_pool")
async def test_storage_calls_run_with_the_callers_context_and_raise_its_errors(
    tmp_path: Path,
) -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller's")
    assert await bounded.call(var.get) == "caller's"
    with pytest.raises(ZeroDivisionError):
        await bounded.call(lambda: 1 / 0)
    with pytest.raises(ValueError, match="timeout_s > 0"):
        bounded.configure(timeout_s=0)


async def test_an_idle_storage_worker_keeps_nothing_of_its_last_call() -> None:
    """A worker waiting for its next call holds neither the last call nor its result (a
    watcher's last evidence read would otherwise keep the whole listing alive)."""

    class Listing:
        pass

    held = Listing()
    result = await bounded.call(lambda listing=held: [listing])
    gone = weakref.ref(held)
    del held, result
    for _ in range(500):  # the worker drops them right after handing the result over
        gc.collect()
        if gone() is None:
            break
        await asyncio.sleep(0.01)
    assert gone() is None
