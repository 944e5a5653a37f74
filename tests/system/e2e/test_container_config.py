"""A service process configured as in a container: ``CKPT_HA_LOG_FORMAT=json`` makes every line
it writes a JSON object (faststream's own lines too), a line logged while handling a message
carries the trace id the message came with, and the probes split: /livez answers while NATS is
unreachable, /readyz does not.

`ckpt-ha serve integrity-checker` (a consumer of one message at a time) and `ckpt-ha serve
registrar` run as real processes against the real NATS and Redis (the test's private streams),
started the way the local stack starts them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.contracts.subjects import event_subject
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.stack import start_service
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import publish_raw, wait_for
from tests.support.cli_tools import stack_env

pytestmark = pytest.mark.e2e

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def json_lines(log: Path) -> list[dict[str, Any]]:
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines, f"{log} is empty"
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line in {log.name}: {line!r}")
    return parsed


async def test_json_logs_carry_the_trace_of_the_message_being_handled(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    env = {
        **stack_env(settings),
        "CKPT_HA_LOG_FORMAT": "json",
        "CKPT_HA_HTTP_HOST": "127.0.0.1",
        "CKPT_HA_STORAGE_ROOT": str(storage),
        "CKPT_HA_SCRUB_INTERVAL_S": "0",
        "CKPT_HA_RECONCILE_INTERVAL_S": "0",
    }
    proc = await asyncio.to_thread(start_service, "integrity-checker", tmp_path, env, 60)
    try:
        assert proc.http_port is not None
        assert await asyncio.to_thread(probe, proc.http_port, "/livez") == (200, {"ok": True})
        status, body = await asyncio.to_thread(probe, proc.http_port, "/readyz")
        assert (status, body["started"], body["checks"]) == (
            200,
            True,
            {"nats": True, "redis": True},
        )
        # Not an event: dead-lettered, and the warning saying so is logged inside the consume
        # span, which continues the trace named by the message's traceparent header.
        subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-json")
        await publish_raw(settings.nats_url, subject, b"not json", {"traceparent": TRACEPARENT})

        async def dead_lettered() -> bool:
            return "dead-lettered seq=" in proc.log_path.read_text()

        await wait_for(dead_lettered, timeout=30, what="the dead-letter warning")
    finally:
        await asyncio.to_thread(procs.stop, proc, timeout=15)
    lines = json_lines(proc.log_path)
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    loggers = {line["logger"] for line in lines}
    assert {"ckpt_ha.runtime", "ckpt_ha.app"} <= loggers, loggers  # ours and faststream's
    warning = next(line for line in lines if line["message"].startswith("dead-lettered seq="))
    assert warning["level"] == "WARNING"
    assert warning["trace_id"] == TRACE_ID
    assert len(warning["span_id"]) == 16


async def test_livez_answers_while_nats_is_unreachable_and_readyz_does_not(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    """Kubernetes restarts a pod whose liveness fails: a service waiting for NATS must pass it
    (it reconnects by itself) while failing readiness."""
    dead_nats = f"nats://127.0.0.1:{procs.free_port()}"
    http_port = procs.free_port()
    env = {
        **stack_env(settings),
        "NATS_URL": dead_nats,
        "CKPT_HA_HTTP_PORT": str(http_port),
        "CKPT_HA_LOG_FORMAT": "json",
    }

    def alive() -> bool:
        try:
            return probe(http_port, "/livez")[0] == 200
        except OSError:
            return False

    proc = await asyncio.to_thread(
        procs.start_process,
        "registrar",
        [sys.executable, "-m", "ckpt_ha.cli.main", "serve", "registrar"],
        home=tmp_path,
        env=env,
        http_port=http_port,
        marker="serve registrar",
        ready=alive,
        timeout=60,
    )
    try:
        status, body = await asyncio.to_thread(probe, http_port, "/readyz")
        assert status == 503
        assert (body["ok"], body["started"]) == (False, False)
        assert body["checks"] == {"nats": False, "redis": True}
        assert (await asyncio.to_thread(probe, http_port, "/healthz"))[0] == 503
        assert procs.is_alive(proc)
    finally:
        await asyncio.to_thread(procs.stop, proc, timeout=15)
