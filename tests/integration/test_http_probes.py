"""The service endpoint's probes, over a real loopback socket: /livez never looks at a
dependency (an orchestrator must not restart a service that is waiting for NATS), /readyz needs
every check and the consumers started, /healthz is /readyz under its older name."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ckpt_ha.runtime.server import HttpEndpoint
from ckpt_ha.telemetry.metrics import ServiceMetrics


class Dependency:
    def __init__(self) -> None:
        self.up = True

    async def check(self) -> bool:
        return self.up


@pytest.fixture
def nats() -> Dependency:
    return Dependency()


@pytest.fixture
async def endpoint(nats: Dependency) -> AsyncIterator[HttpEndpoint]:
    http = HttpEndpoint(ServiceMetrics("probe"), {"nats": nats.check}, "127.0.0.1", 0)
    await http.start()
    try:
        yield http
    finally:
        await http.stop()


async def get(http: HttpEndpoint, path: str) -> tuple[int, dict[str, Any]]:
    def call() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http.port}{path}", timeout=5) as r:
                return int(r.status), json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    return await asyncio.to_thread(call)


async def test_all_three_answer_ok_when_ready(endpoint: HttpEndpoint) -> None:
    assert await get(endpoint, "/livez") == (200, {"ok": True})
    ready = (200, {"ok": True, "started": True, "checks": {"nats": True}})
    assert await get(endpoint, "/readyz") == ready
    assert await get(endpoint, "/healthz") == ready


async def test_a_lost_dependency_fails_readiness_but_not_liveness(
    endpoint: HttpEndpoint, nats: Dependency
) -> None:
    nats.up = False
    assert await get(endpoint, "/livez") == (200, {"ok": True})
    not_ready = (503, {"ok": False, "started": True, "checks": {"nats": False}})
    assert await get(endpoint, "/readyz") == not_ready
    assert await get(endpoint, "/healthz") == not_ready


async def test_consumers_not_started_is_not_ready_yet_alive(endpoint: HttpEndpoint) -> None:
    endpoint.started = False
    assert await get(endpoint, "/livez") == (200, {"ok": True})
    status, body = await get(endpoint, "/readyz")
    assert (status, body["ok"], body["started"]) == (503, False, False)
    assert body["checks"] == {"nats": True}
