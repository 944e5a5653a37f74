"""What a JetStream cluster asks of the bus, without a server: a URL naming several servers, the
streams' replica count from the settings, and publishes retried through a leader election."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from ckpt_ha.bus import streams
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.publishing import publish_pipelined, publish_retrying
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.job import JobFailedV1
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol as sdk_protocol
from tests.support.events import T0


def test_a_url_may_list_the_servers_of_a_cluster() -> None:
    cfg = BusConfig(url="nats://u:pw@n1:4222, nats://u:pw@n2:4222,nats://u:pw@n3:4222")
    assert cfg.servers == ["nats://u:pw@n1:4222", "nats://u:pw@n2:4222", "nats://u:pw@n3:4222"]
    assert "pw" not in cfg.shown_url
    assert [part.rsplit("@", 1)[1] for part in cfg.shown_url.split(",")] == [
        "n1:4222",
        "n2:4222",
        "n3:4222",
    ]
    assert BusConfig().servers == ["nats://127.0.0.1:4222"]
    # A training process is handed the same NATS_URL by its runner.
    job_bus = sdk_protocol.BusEndpoint(url="nats://n1:4222,nats://n2:4222")
    assert job_bus.servers == ["nats://n1:4222", "nats://n2:4222"]


def test_stream_replicas_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_HA_STREAM_REPLICAS", raising=False)
    assert ServiceSettings().bus().replicas == 1
    monkeypatch.setenv("CKPT_HA_STREAM_REPLICAS", "3")
    cfg = ServiceSettings().bus()
    assert cfg.replicas == 3
    assert {s.num_replicas for s in streams.desired(cfg)} == {3}
    monkeypatch.setenv("CKPT_HA_STREAM_REPLICAS", "0")
    with pytest.raises(ValueError, match="stream_replicas"):
        ServiceSettings()


def test_a_service_accepts_more_replicas_than_it_needs_never_fewer() -> None:
    one, three = (streams.desired(BusConfig(replicas=n))[0] for n in (1, 3))
    assert streams.differences(one, three) == []
    assert streams.differences(three, one) == ["num_replicas is 1, needs 3"]


class Flaky:
    """A publish that fails with ``errors`` in turn, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


async def test_a_publish_unanswered_during_an_election_is_retried() -> None:
    send = Flaky(NoStreamResponseError(), NatsTimeout(), ServiceUnavailableError())
    await publish_retrying(send, BusConfig(publish_retry_s=5), "test")
    assert send.calls == 4


async def test_retries_stop_at_the_budget_with_the_last_error() -> None:
    send = Flaky(*(NoStreamResponseError() for _ in range(100)))
    with pytest.raises(NoStreamResponseError):
        await publish_retrying(send, BusConfig(publish_retry_s=0.5), "test")
    assert 2 <= send.calls < 100


async def test_a_refused_publish_is_not_retried() -> None:
    send = Flaky(APIError(code=400, description="maximum payload exceeded"))
    with pytest.raises(APIError):
        await publish_retrying(send, BusConfig(publish_retry_s=5), "test")
    assert send.calls == 1


class Acks:
    """A pipelined publish whose acks come back as ``outcomes`` say, by subject: a result, an
    error, or never (None); the retrying publish of the same event records the subject."""

    def __init__(self, outcomes: dict[str, Exception | str | None]) -> None:
        self.outcomes = outcomes
        self.retried: list[str] = []

    async def send_async(
        self, subject: str, body: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[Any]:
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        outcome = self.outcomes[subject.split(".")[-1]]
        if isinstance(outcome, Exception):
            ack.set_exception(outcome)
        elif outcome is not None:
            ack.set_result(outcome)
        return ack

    async def send(self, subject: str, body: bytes, headers: Mapping[str, str]) -> object:
        self.retried.append(subject.split(".")[-1])
        return "stored"


async def test_pipelined_publishes_retry_the_unanswered_alone_and_keep_each_result() -> None:
    """Stored, refused for now (an election), never answered, refused for good: the first is
    not sent again, the next two are published again the retrying way, the last keeps its
    error; every publish keeps its own result."""
    refused = APIError(code=400, description="maximum payload exceeded")
    acks = Acks({"j1": "ack", "j2": NoStreamResponseError(), "j3": None, "j4": refused})
    events = [failed(job) for job in ("j1", "j2", "j3", "j4")]
    cfg = BusConfig(publish_timeout_s=0.2, publish_retry_s=1)
    results = await publish_pipelined(cfg, events, acks.send_async, acks.send)
    assert results == [None, None, None, refused]
    assert acks.retried == ["j2", "j3"]


def failed(job: str) -> Envelope[EventData]:
    data = JobFailedV1(job_id=job, run_id="r", attempt=1)
    return build(data, source="test", time=T0, key="f1")
