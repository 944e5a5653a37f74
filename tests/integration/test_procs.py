"""ckpt_ha.lab.devstack.procs against real nats-server and redis-server processes (no mocks)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import nats
import nats.errors
import pytest
import redis
from nats.js import JetStreamContext

from ckpt_ha.lab.devstack.procs import (
    ManagedProcess,
    ProcessNotRunning,
    ProcessStartFailed,
    free_port,
    is_alive,
    kill,
    nats_server_binary,
    pause,
    redis_server_binary,
    resume,
    start_nats,
    start_process,
    start_redis,
    stop,
)

if TYPE_CHECKING:
    from tests.support.private_infra import ProcessJanitor

# Registers the private_* fixtures and process_janitor. Importing the fixtures by name works too,
# but then every test parameter trips ruff's F811 (redefinition of an unused name).
pytest_plugins = ["tests.support.private_infra"]
pytestmark = pytest.mark.integration


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def _jetstream(url: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


def test_bundled_binaries_are_found() -> None:
    assert nats_server_binary().is_file()
    assert redis_server_binary().is_file()


def test_managed_process_round_trips_through_json(private_nats: ManagedProcess) -> None:
    assert ManagedProcess.from_json(private_nats.to_json()) == private_nats
    assert private_nats.url == f"nats://127.0.0.1:{private_nats.port}"
    assert private_nats.http_port is not None


async def test_jetstream_messages_survive_a_restart(
    private_nats: ManagedProcess, private_nats_home: Path, process_janitor: ProcessJanitor
) -> None:
    stream = _unique("PROCS")
    async with _jetstream(private_nats.url) as js:
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        ack = await js.publish(f"{stream}.a", b"kept", timeout=5)
        assert ack.stream == stream
        assert (await js.stream_info(stream)).state.messages == 1

    await asyncio.to_thread(stop, private_nats)
    assert not is_alive(private_nats)

    restarted = process_janitor.track(await asyncio.to_thread(start_nats, private_nats_home))
    async with _jetstream(restarted.url) as js:
        assert (await js.stream_info(stream)).state.messages == 1
        assert (await js.get_msg(stream, ack.seq)).data == b"kept"


async def test_paused_broker_times_out_and_recovers_on_resume(
    private_nats: ManagedProcess,
) -> None:
    stream = _unique("PAUSE")
    async with _jetstream(private_nats.url) as js:
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        await asyncio.to_thread(pause, private_nats)
        try:
            assert is_alive(private_nats)  # stopped, not dead
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(f"{stream}.a", b"lost?", timeout=0.5)
        finally:
            await asyncio.to_thread(resume, private_nats)
        ack = await js.publish(f"{stream}.a", b"after", timeout=5)
        assert ack.stream == stream


async def test_acked_jetstream_message_survives_sigkill(
    private_nats: ManagedProcess, private_nats_home: Path, process_janitor: ProcessJanitor
) -> None:
    # sync_interval: always -- an ack means the message is on disk, even if the broker crashes.
    stream = _unique("CRASH")
    async with _jetstream(private_nats.url) as js:
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        ack = await js.publish(f"{stream}.a", b"durable", timeout=5)

    await asyncio.to_thread(kill, private_nats)
    assert not is_alive(private_nats)

    restarted = process_janitor.track(
        await asyncio.to_thread(start_nats, private_nats_home, port=private_nats.port)
    )
    async with _jetstream(restarted.url) as js:
        assert (await js.get_msg(stream, ack.seq)).data == b"durable"


def test_a_second_server_on_the_same_data_dir_is_refused(
    private_nats: ManagedProcess,
    private_nats_home: Path,
    private_redis: ManagedProcess,
    private_redis_home: Path,
) -> None:
    # Neither nats-server nor redis-server locks its data directory; two on one would corrupt it.
    with pytest.raises(ProcessStartFailed, match="is locked"):
        start_nats(private_nats_home)
    with pytest.raises(ProcessStartFailed, match="is locked"):
        start_redis(private_redis_home)
    assert is_alive(private_nats)
    assert is_alive(private_redis)


def test_stop_continues_a_paused_process(private_nats: ManagedProcess) -> None:
    pause(private_nats)
    stop(private_nats, timeout=5)
    assert not is_alive(private_nats)


def test_redis_data_survives_a_restart(
    private_redis: ManagedProcess, private_redis_home: Path, process_janitor: ProcessJanitor
) -> None:
    key = _unique("procs:key")
    with redis.Redis.from_url(private_redis.url, socket_timeout=5) as client:
        assert client.set(key, b"kept")

    stop(private_redis)
    assert not is_alive(private_redis)

    restarted = process_janitor.track(start_redis(private_redis_home, port=private_redis.port))
    assert restarted.url == private_redis.url
    with redis.Redis.from_url(restarted.url, socket_timeout=5) as client:
        assert client.get(key) == b"kept"


def test_kill_is_immediate_and_stop_afterwards_is_a_no_op(private_redis: ManagedProcess) -> None:
    kill(private_redis)
    assert not is_alive(private_redis)
    stop(private_redis)
    stop(private_redis)
    kill(private_redis)
    with pytest.raises(ProcessNotRunning):
        pause(private_redis)


def test_stop_spares_a_pid_whose_cmdline_does_not_match(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        impostor = ManagedProcess(
            name="nats",
            pid=bystander.pid,
            port=free_port(),
            url="nats://127.0.0.1:1",
            log_path=tmp_path / "nats.log",
            marker="nats-server",
        )
        assert not is_alive(impostor)
        stop(impostor, timeout=1)
        kill(impostor)
        with pytest.raises(ProcessNotRunning):
            pause(impostor)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=5)


def test_stop_spares_a_recycled_pid(private_redis: ManagedProcess) -> None:
    # Same pid and command line, different start time: what a recycled pid looks like.
    assert private_redis.start_ticks is not None
    recycled = dataclasses.replace(private_redis, start_ticks=private_redis.start_ticks - 1)
    assert not is_alive(recycled)
    stop(recycled, timeout=1)
    assert is_alive(private_redis)


def test_start_refuses_a_port_that_is_taken(private_nats: ManagedProcess, tmp_path: Path) -> None:
    with pytest.raises(ProcessStartFailed, match="already in use"):
        start_redis(tmp_path / "other", port=private_nats.port)


def test_start_failure_reports_exit_code_and_log_tail(tmp_path: Path) -> None:
    argv = ["/bin/sh", "-c", "echo 'no config for you' >&2; exit 3"]
    with pytest.raises(ProcessStartFailed) as failure:
        start_process("broken", argv, home=tmp_path, port=free_port(), timeout=5)
    assert failure.value.name == "broken"
    assert "code 3" in failure.value.reason
    assert "no config for you" in failure.value.log_tail


def test_start_times_out_and_kills_a_process_that_never_gets_ready(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleepy.pid"
    argv = ["/bin/sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
    with pytest.raises(ProcessStartFailed, match="not ready"):
        start_process("sleepy", argv, home=tmp_path, marker="sleep", ready=lambda: False, timeout=1)
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped, not left behind


def test_start_rejects_a_marker_that_would_make_the_process_unstoppable(tmp_path: Path) -> None:
    pid_file = tmp_path / "unmarked.pid"
    argv = ["/bin/sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
    with pytest.raises(ProcessStartFailed, match="command line lacks 'nats-server'"):
        start_process(
            "unmarked",
            argv,
            home=tmp_path,
            marker="nats-server",
            ready=lambda: pid_file.exists() and pid_file.read_text().endswith("\n"),
            timeout=5,
        )
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists()
