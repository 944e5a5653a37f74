"""Bounded waits against real servers: a NATS that goes away for longer than nats-py's default
retry budget, a Redis that restarts under a client, handlers that hang, an S3 endpoint that
accepts connections and never answers, and commands that cannot reach NATS.

Private servers only (never the shared ones): each test starts its own nats-server or
redis-server and restarts it on the same port, as ``ckpt-ha up`` does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nats
import pytest

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registry.client import RedisConfig, connect
from ckpt_ha.runtime.server import HttpEndpoint
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import StorageUnavailable
from ckpt_ha.storage.s3_store import S3Store
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.bus_tools import SIGNING_KEY, stream_messages, wait_for
from tests.support.events import committed
from tests.support.moto_server import FAKE_ACCESS_KEY, FAKE_SECRET_KEY, start_moto_server
from tests.support.private_infra import ProcessJanitor
from tests.support.tcp_gate import TcpGate

pytestmark = pytest.mark.integration

NATS_PY_DEFAULT_ATTEMPTS = 60
"""nats-py gives up after this many reconnect attempts unless told otherwise."""


def dependency_up(metrics: ServiceMetrics, dependency: str) -> float | None:
    return metrics.registry.get_sample_value(
        "ckpt_ha_dependency_up", {"service": metrics.service, "dependency": dependency}
    )


def private_bus_config(url: str, unique: str, **changes: Any) -> BusConfig:
    return BusConfig(
        url=url,
        prefix=f"t{unique}",
        events_stream=f"EV_{unique}",
        dead_letter_stream=f"DLQ_{unique}",
        progress_stream=f"PR_{unique}",
        signing_keys=(bytes.fromhex(SIGNING_KEY),),
        ack_wait_s=2.0,
        max_deliver=3,
        backoff_s=(0.2,),
        graceful_timeout_s=3.0,
        **changes,
    )


async def provision(cfg: BusConfig) -> None:
    nc = await nats.connect(cfg.url)
    try:
        await streams.provision(nc.jetstream(), cfg)
    finally:
        await nc.close()


async def test_a_service_reconnects_after_more_attempts_than_nats_py_would_make(
    private_nats: procs.ManagedProcess,
    private_nats_home: Path,
    process_janitor: ProcessJanitor,
    unique: str,
) -> None:
    """Forever, shown in seconds: waits of 10-20 ms make nats-py's default budget of 60
    attempts run out within about a second of the outage; the service's bus keeps trying,
    reports NATS down on /healthz and the gauge meanwhile, and consumes again once the broker is
    back on its port."""
    cfg = private_bus_config(
        private_nats.url, unique, reconnect_wait_s=0.01, reconnect_wait_max_s=0.02
    )
    await provision(cfg)
    bus = Bus(cfg, "svc", lasting=True)
    seen: list[str] = []

    @bus.consumer("work", event_filter(cfg.prefix, "checkpoint.committed"))
    async def work(event: Envelope[EventData]) -> None:
        seen.append(getattr(event.data, "checkpoint_id", ""))

    metrics = ServiceMetrics("svc")

    async def nats_ok() -> bool:
        return await bus.broker.ping(timeout=0.5)

    endpoint = HttpEndpoint(metrics, {"nats": nats_ok}, "127.0.0.1", 0)
    await bus.broker.start()
    try:
        connection = bus.broker.connection
        assert connection.options["max_reconnect_attempts"] == -1
        assert bus.reconnects is not None
        assert await endpoint.health() == (True, {"nats": True})
        assert dependency_up(metrics, "nats") == 1

        procs.kill(private_nats)

        async def past_the_default_budget() -> bool:
            return bus.reconnects is not None and (
                bus.reconnects.attempts > NATS_PY_DEFAULT_ATTEMPTS + 5
            )

        await wait_for(past_the_default_budget, timeout=30, what="65 reconnect attempts")
        assert not connection.is_closed  # still trying, not given up
        assert await endpoint.health() == (False, {"nats": False})
        assert dependency_up(metrics, "nats") == 0

        process_janitor.track(
            procs.start_nats(
                private_nats_home, port=private_nats.port, http_port=private_nats.http_port
            )
        )

        async def back() -> bool:
            return connection.is_connected

        await wait_for(back, timeout=30, what="the bus to reconnect")
        assert await endpoint.health() == (True, {"nats": True})
        assert dependency_up(metrics, "nats") == 1
        producer = Bus(cfg, "producer")
        await producer.broker.start()
        try:
            await producer.publish(committed("after-outage"))
        finally:
            await producer.broker.stop()

        async def consumed() -> bool:
            return "after-outage" in seen

        await wait_for(consumed, timeout=30, what="the event consumed after the outage")
    finally:
        await bus.broker.stop()


async def test_a_redis_client_survives_a_restart_between_commands(
    private_redis: procs.ManagedProcess,
    private_redis_home: Path,
    process_janitor: ProcessJanitor,
) -> None:
    """The pooled connection dies with the server; the next command meets a connection error
    and is retried on a new connection (with backoff) instead of failing its handler."""
    client = connect(RedisConfig(private_redis.url, retry_backoff_s=0.05))
    try:
        assert await client.set("k", "v")
        procs.stop(private_redis)  # SIGTERM: the AOF is written, the port freed
        process_janitor.track(procs.start_redis(private_redis_home, port=private_redis.port))
        assert await client.get("k") == "v"
    finally:
        await client.aclose()


async def test_redis_calls_fail_within_their_timeout_when_redis_is_frozen(
    private_redis: procs.ManagedProcess,
) -> None:
    import redis.exceptions

    client = connect(RedisConfig(private_redis.url, timeout_s=0.3))
    try:
        assert await client.ping()
        procs.pause(private_redis)
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.get("k")
            assert time.monotonic() - started < 5
        finally:
            procs.resume(private_redis)
        assert await client.ping()
    finally:
        await client.aclose()


async def _dead_letters(cfg: BusConfig) -> list[dict[str, str]]:
    msgs = await stream_messages(cfg.url, cfg.dead_letter_stream)
    return [dict(m.headers or {}, body=m.data.decode()) for m in msgs]


async def test_a_hanging_handler_is_cancelled_at_its_deadline_and_naked(
    settings: ServiceSettings,
) -> None:
    """Deadline 0.5 s: each delivery of the hanging event is cancelled and nak'ed (not held
    with in-progress acks), the last one dead-letters it, and the event behind it is handled."""
    cfg = settings.model_copy(update={"handler_deadline_s": 0.5, "ack_wait_s": 5.0}).bus()
    bus = Bus(cfg, "hang")
    attempts: list[str] = []
    handled: list[str] = []
    cancelled = 0

    @bus.consumer("work", event_filter(cfg.prefix, "checkpoint.committed"))
    async def work(event: Envelope[EventData]) -> None:
        nonlocal cancelled
        ckpt = getattr(event.data, "checkpoint_id", "")
        attempts.append(ckpt)
        if ckpt == "hangs":
            try:
                await asyncio.Event().wait()  # a dependency that never answers
            except asyncio.CancelledError:
                cancelled += 1
                raise
        handled.append(ckpt)

    await bus.broker.start()
    try:
        await bus.publish(committed("hangs"))
        await bus.publish(committed("behind-it"))

        async def dead_lettered() -> list[dict[str, str]]:
            return await _dead_letters(cfg)

        [letter] = await wait_for(dead_lettered, timeout=30, what="the hanging event's letter")
        assert letter["Ckpt-Error-Code"] == "max_deliver"
        assert "HandlerDeadlineExceeded" in letter["Ckpt-Error"]
        assert "deadline of 0.5s" in letter["Ckpt-Error"]
        assert letter["Ckpt-Delivery-Count"] == str(cfg.max_deliver)
        assert json.loads(letter["body"])["data"]["checkpoint_id"] == "hangs"

        async def behind_handled() -> bool:
            return "behind-it" in handled

        await wait_for(behind_handled, timeout=15, what="the next event handled")
        assert attempts.count("hangs") == cfg.max_deliver == cancelled
    finally:
        await bus.broker.stop()


async def test_a_hanging_batch_handler_naks_its_whole_batch_at_the_deadline(
    settings: ServiceSettings,
) -> None:
    cfg = settings.model_copy(
        update={"handler_deadline_s": 0.5, "ack_wait_s": 1.0, "max_deliver": 4}
    ).bus()
    bus = Bus(cfg, "hang")
    calls = 0

    @bus.batch_consumer("batches", event_filter(cfg.prefix, "checkpoint.committed"))
    async def batches(events: list[Envelope[EventData]]) -> Sequence[BaseException | None]:
        nonlocal calls
        calls += 1
        if calls <= 2:
            await asyncio.Event().wait()  # Redis frozen for the first two deliveries
        return [None] * len(events)

    await bus.broker.start()
    nc = await nats.connect(cfg.url)
    try:
        for i in range(3):
            await bus.publish(committed(f"batch-{i}"))

        async def settled() -> bool:
            info = await nc.jetstream().consumer_info(cfg.events_stream, "hang--batches")
            return info.num_ack_pending == 0 and info.num_pending == 0 and calls >= 3

        await wait_for(settled, timeout=30, what="the batch acked on a later delivery")
        info = await nc.jetstream().consumer_info(cfg.events_stream, "hang--batches")
        assert info.delivered.stream_seq == 3
        assert await _dead_letters(cfg) == []
    finally:
        await nc.close()
        await bus.broker.stop()


async def test_an_s3_endpoint_that_never_answers_is_unavailable_within_its_timeouts() -> None:
    endpoint, stop = start_moto_server()
    upstream = endpoint.removeprefix("http://").split(":")
    try:
        with TcpGate((upstream[0], int(upstream[1]))) as gate:
            store = S3Store(
                "no-answer",
                endpoint_url=f"http://127.0.0.1:{gate.port}",
                access_key=FAKE_ACCESS_KEY,
                secret_key=FAKE_SECRET_KEY,
                connect_timeout_s=0.5,
                read_timeout_s=0.5,
                max_attempts=2,
            )
            started = time.monotonic()
            with pytest.raises(StorageUnavailable) as caught:
                await asyncio.to_thread(store.stat, "step-1/manifest.json")
            assert time.monotonic() - started < 10
            assert caught.value.transient
            assert "timeout" in str(caught.value).lower()
    finally:
        stop()


def test_commands_that_cannot_reach_nats_fail_in_one_line(tmp_path: Path) -> None:
    """A command connects a bounded number of times, then says so in one line (exit 1)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    env = {
        **os.environ,
        "CKPT_HA_HOME": str(tmp_path),
        "NATS_URL": f"nats://127.0.0.1:{closed}",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
    for args in (["dead-letters"], ["streams", "check"]):
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "ckpt_ha.cli.main", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 3, (args, out.stderr)
        assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
        assert f"127.0.0.1:{closed}" in out.stderr
        assert time.monotonic() - started < 30
