"""One framing on the wire (`ckpt_ha.contracts.framing`): the SDK in a training process and a
service's bus put the same event on NATS as the same bytes, and each is admitted by the
services' admission (pure: no broker)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from ckpt_ha.bus import publishing
from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG, Envelope, EventData, build, framing, signing
from ckpt_ha.contracts.errors import ForgedEvent, UnsignedEvent
from ckpt_ha.sdk.protocol import SOURCE, BusEndpoint, envelope_bytes
from tests.support.events import T0, committed

MASTER = bytes(range(16, 48))
CFG = BusConfig(prefix="px", signing_keys=(MASTER,))
JOB = "job-f"
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
Framed = tuple[str, bytes, dict[str, str]]


def by_the_sdk(job_key: bytes | None, traceparent: str | None = None) -> Framed:
    endpoint = BusEndpoint("nats://127.0.0.1:4222", prefix=CFG.prefix, job_key=job_key)
    return envelope_bytes(endpoint, committed("c1", job=JOB).data, T0, "k", traceparent)


async def by_a_service(event: Envelope[EventData], cfg: BusConfig = CFG) -> Framed:
    sent: list[Framed] = []

    async def send(subject: str, body: bytes, headers: Mapping[str, str]) -> None:
        sent.append((subject, body, dict(headers)))

    await publishing.publish(cfg, event, send)
    [framed] = sent
    return framed


def sdk_envelope(traceparent: str | None = None) -> Envelope[EventData]:
    """The envelope the SDK builds for the same save."""
    data = committed("c1", job=JOB).data
    return build(data, source=SOURCE, time=T0, key="k", traceparent=traceparent)


@pytest.mark.parametrize("traceparent", [None, TRACE])
async def test_the_sdk_and_a_service_frame_one_event_as_the_same_bytes(
    traceparent: str | None,
) -> None:
    job_key = signing.job_key(MASTER, JOB)
    subject, body, headers = by_the_sdk(job_key, traceparent)
    by_bus_subject, by_bus_body, by_bus_headers = await by_a_service(sdk_envelope(traceparent))
    assert (by_bus_subject, by_bus_body) == (subject, body)
    assert list(by_bus_headers.items()) == list(headers.items())
    # Same headers in the same order: dedupe id, trace, signature.
    order = [framing.MSG_ID, framing.TRACEPARENT, framing.SIGNATURE]
    assert list(headers) == [name for name in order if traceparent or name != framing.TRACEPARENT]
    assert headers[framing.MSG_ID] == framing.message_id(job_key, sdk_envelope().id)
    assert headers[framing.SIGNATURE] == framing.signature(job_key, subject, body)


def test_what_the_sdk_frames_the_services_admit_and_only_with_its_own_jobs_key() -> None:
    subject, body, headers = by_the_sdk(signing.job_key(MASTER, JOB))
    assert admit(CFG, CATALOG, body, subject, headers) == sdk_envelope()
    subject, body, headers = by_the_sdk(signing.job_key(MASTER, "another-job"))
    with pytest.raises(ForgedEvent):
        admit(CFG, CATALOG, body, subject, headers)
    subject, body, headers = by_the_sdk(None)  # a training process without its job key
    assert headers == {framing.MSG_ID: sdk_envelope().id}
    with pytest.raises(UnsignedEvent):
        admit(CFG, CATALOG, body, subject, headers)


async def test_what_a_service_frames_the_services_admit() -> None:
    event = sdk_envelope(TRACE)
    subject, body, headers = await by_a_service(event)
    assert admit(CFG, CATALOG, body, subject, headers) == event
    # A process without the master key cannot sign: its event of a signed type is refused.
    subject, body, headers = await by_a_service(event, BusConfig(prefix=CFG.prefix))
    with pytest.raises(UnsignedEvent):
        admit(CFG, CATALOG, body, subject, headers)
