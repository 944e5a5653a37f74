"""A service's /metrics against the real NATS and Redis: dead letters by consumer and code, the
JetStream consumer lag polled from the server, faststream's message metrics labelled without the
job, and the registrar's lifecycle metrics."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ckpt_ha.contracts.subjects import event_subject
from ckpt_ha.registrar.app import Registrar, build
from ckpt_ha.registrar.settings import RegistrarSettings
from ckpt_ha.runtime.server import HttpEndpoint, poll_consumers
from ckpt_ha.runtime.settings import ServiceSettings
from tests.support.bus_tools import publish_raw, stream_messages, wait_for
from tests.support.events import T0, committed, verified

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append((s.labels, s.value))
    return found


async def test_metrics_endpoint_shows_dead_letters_lag_and_faststream_messages(
    settings: ServiceSettings, registrar: Registrar
) -> None:
    http = HttpEndpoint(registrar.metrics, {}, "127.0.0.1", 0)
    port = await http.start()
    poller = asyncio.create_task(poll_consumers(registrar.bus, registrar.metrics, 0.2))
    try:
        subject = event_subject(settings.subject_prefix, "checkpoint.committed", 1, "job-m")
        await publish_raw(settings.nats_url, subject, b"{not json")
        await registrar.bus.publish(committed("m1", job="job-m"))

        async def dead_letter_code() -> str | None:
            letters = await stream_messages(settings.nats_url, settings.dead_letter_stream)
            return (letters[0].headers or {}).get("Ckpt-Error-Code") if letters else None

        code = await wait_for(dead_letter_code, timeout=15, what="the dead letter")

        async def scraped() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            found = await asyncio.to_thread(scrape, port)
            done = (
                found.get("ckpt_ha_checkpoint_states_total")
                and found.get("ckpt_ha_consumer_info_timestamp_seconds")
                and found.get("ckpt_ha_jetstream_storage_bytes")
                # the poll after both events and the dead letter were stored
                and [v for labels, v in found.get("ckpt_ha_stream_messages", [])
                     if labels["stream"] == settings.dead_letter_stream and v >= 1]
            )  # fmt: skip
            return found if done else None

        found = await wait_for(scraped, timeout=15, what="metrics of both events")
    finally:
        poller.cancel()
        await http.stop()

    consumer = "registrar--checkpoints"
    assert ({"service": "registrar", "consumer": consumer, "code": code}, 1.0) in found[
        "ckpt_ha_dead_letters_total"
    ]
    pending = {s[0]["consumer"]: s[1] for s in found["ckpt_ha_consumer_pending_messages"]}
    assert pending == {consumer: 0.0, "registrar--fences": 0.0}  # both of its consumers
    # JetStream storage: both streams hold what was published, without a byte limit; the
    # progress stream (empty here) has its cap.
    streams = {s[0]["stream"]: s[1] for s in found["ckpt_ha_stream_messages"]}
    assert streams[settings.events_stream] >= 2
    assert streams[settings.dead_letter_stream] >= 1
    sizes = {s[0]["stream"]: s[1] for s in found["ckpt_ha_stream_bytes"]}
    assert sizes[settings.events_stream] > 0
    limits = {s[0]["stream"]: s[1] for s in found["ckpt_ha_stream_max_bytes"]}
    assert limits == {
        settings.events_stream: -1.0,
        settings.dead_letter_stream: -1.0,
        settings.progress_stream: float(settings.progress_max_bytes),
    }
    ((_, used),) = found["ckpt_ha_jetstream_storage_bytes"]
    assert used >= sizes[settings.events_stream]
    assert found["ckpt_ha_jetstream_storage_limit_bytes"]
    assert ({"service": "registrar", "state": "pending_verification", "format": "native"},
            1.0) in found["ckpt_ha_checkpoint_states_total"]  # fmt: skip
    handlers = {s[0]["handler"] for s in found["faststream_received_messages_total"]}
    assert handlers
    assert not [h for h in handlers if "job-m" in h]
    published = {s[0]["destination"] for s in found["faststream_published_messages_total"]}
    assert f"{settings.subject_prefix}.ev.checkpoint.committed.v1.*" in published
    assert not [d for d in published if "job-m" in d]
    assert not [k for k, v in found.items() for labels, _ in v if "m1" in labels.values()]


async def test_a_restarted_registrar_continues_the_recovery_point_from_the_registry(
    settings: ServiceSettings, registrar: Registrar
) -> None:
    await registrar.registry.apply(committed("r1", job="job-r", step=5))
    await registrar.registry.apply(verified("r1", job="job-r", step=5))
    # The events are dated T0: keep jobs idle since then.
    year = 365 * 24 * 3600.0
    restarted = build(
        RegistrarSettings.model_validate({**settings.model_dump(), "metrics_forget_after_s": year})
    )
    try:
        assert restarted.on_start is not None
        await restarted.on_start()
    finally:
        await restarted.registry.close()
    seeded = restarted.metrics.registry.get_sample_value(
        "ckpt_ha_last_valid_checkpoint_timestamp_seconds", {"job_id": "job-r"}
    )
    assert seeded == T0.timestamp()
