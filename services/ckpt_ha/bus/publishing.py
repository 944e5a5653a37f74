"""How a service publishes an event: framed, traced, and retried through a leader election.

Every publish is framed as every producer frames it (`ckpt_ha.contracts.framing`): its
``Nats-Msg-Id`` is the event's deterministic id (keyed, for a signed event), so JetStream dedupes
retries; a publish that goes unanswered or is refused for now (a stream leader election in a
cluster, a reconnect) is retried for up to ``publish_retry_s`` (`publish_retrying`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError
from opentelemetry.trace import SpanKind

from ckpt_ha.bus.admission import job_key
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventData, framing
from ckpt_ha.telemetry import tracing

log = logging.getLogger("ckpt_ha.bus")

UNANSWERED_PUBLISH = (
    NatsTimeout,
    NoRespondersError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
"""What a JetStream publish meets while the stream has no leader (an election after a node
died, a reconnect to another server): worth retrying. Any other refusal (a wrong stream, a
message too large, a permission) is final."""

_PUBLISH_RETRY_FIRST_S = 0.1
_PUBLISH_RETRY_MAX_S = 1.0


async def publish_retrying(
    send: Callable[[], Awaitable[object]], cfg: BusConfig, what: str
) -> None:
    """``send`` until it succeeds, retrying `UNANSWERED_PUBLISH` for up to ``publish_retry_s``
    (waits from 0.1 s doubling to 1 s), then raising the last error.

    Safe because every publish carries the event's id as ``Nats-Msg-Id``: a publish that was
    stored but whose ack was lost is dropped by JetStream's duplicate window when retried."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.publish_retry_s
    wait = _PUBLISH_RETRY_FIRST_S
    while True:
        try:
            await send()
        except UNANSWERED_PUBLISH as exc:
            if loop.time() + wait > deadline:
                raise
            log.warning("publish %s unanswered (%r); retrying in %.1fs", what, exc, wait)
        else:
            return
        await asyncio.sleep(wait)
        wait = min(wait * 2, _PUBLISH_RETRY_MAX_S)


Send = Callable[[str, bytes, Mapping[str, str]], Awaitable[object]]
"""One JetStream publish of (subject, body, headers)."""
SendAsync = Callable[[str, bytes, Mapping[str, str]], Awaitable["asyncio.Future[Any]"]]
"""One JetStream publish of (subject, body, headers) sent without waiting: its ack's future."""


async def publish(cfg: BusConfig, event: Envelope[EventData], send: Send) -> Envelope[EventData]:
    """Publish ``event`` through ``send``; ``Nats-Msg-Id`` = event id, so retries are deduped
    (an unanswered publish is retried: `publish_retrying`).

    Traced: the publish (a producer span) is a child of the envelope's ``traceparent`` when
    it has one, else of the current span (a new trace when there is none); an envelope without
    a ``traceparent`` gets this span's, and the headers carry it. Returns the envelope as
    published.
    """
    with _framed(cfg, event) as (event, subject, body, headers):
        await publish_retrying(
            lambda: send(subject, body, headers), cfg, f"{event.event_type} {event.id}"
        )
    return event


async def publish_pipelined(
    cfg: BusConfig, events: Sequence[Envelope[EventData]], send_async: SendAsync, send: Send
) -> list[Exception | None]:
    """Publish ``events`` at once: each framed and traced as `publish` does and sent without
    waiting for its ack, then every ack awaited together (for at most ``publish_timeout_s``).
    One left unanswered (or refused for now, `UNANSWERED_PUBLISH`) is published again the
    retrying way (`publish_retrying`): its id dedupes it if it was stored after all. Each
    event's result, in their order: None once stored, else its error.

    They are sent in their order, but one published again lands after those sent after it:
    events that must land in order go in successive calls."""
    sent: list[tuple[str, str, bytes, Mapping[str, str], asyncio.Future[Any] | Exception]] = []
    for event in events:
        with _framed(cfg, event) as (framed, subject, body, headers):
            try:
                ack: asyncio.Future[Any] | Exception = await send_async(subject, body, headers)
            except Exception as exc:  # noqa: BLE001 - this event's own result
                ack = exc
        sent.append((f"{framed.event_type} {framed.id}", subject, body, headers, ack))
    waiting = [a for *_, a in sent if isinstance(a, asyncio.Future)]
    if waiting:
        await asyncio.wait(waiting, timeout=cfg.publish_timeout_s)
    results: list[Exception | None] = []
    for what, to, payload, framing_headers, settled in sent:
        error = _outcome(settled)
        if isinstance(error, UNANSWERED_PUBLISH):
            try:
                await publish_retrying(
                    functools.partial(send, to, payload, framing_headers), cfg, what
                )
                error = None
            except Exception as exc:  # noqa: BLE001 - this event's own result
                error = exc
        results.append(error)
    return results


def _outcome(ack: asyncio.Future[Any] | Exception) -> Exception | None:
    """A pipelined publish's error (None: stored); one still unanswered is given up here (a
    timeout, published again by the caller)."""
    if isinstance(ack, Exception):
        return ack
    if not ack.done():
        ack.cancel()
        return NatsTimeout()
    if ack.cancelled():
        return NatsTimeout()
    error = ack.exception()
    if error is None:
        return None
    if isinstance(error, Exception):
        return error
    raise error


@contextlib.contextmanager
def _framed(
    cfg: BusConfig, event: Envelope[EventData]
) -> Iterator[tuple[Envelope[EventData], str, bytes, dict[str, str]]]:
    """(the envelope as published, its subject, body and headers), inside its publish's span
    (`publish` says which)."""
    subject = framing.subject(cfg.prefix, event)
    recording = tracing.recording()
    # With no span to record, the event's own context is made current (no span objects):
    # the headers then carry it, and what is logged meanwhile carries its trace id.
    scope = (
        tracing.tracer().start_as_current_span(
            f"publish {event.event_type}",
            context=tracing.context_of(event.traceparent, event.tracestate),
            kind=SpanKind.PRODUCER,
            attributes={**tracing.event_attributes(event), **_messaging(subject, event.id)},
        )
        if recording
        else tracing.continue_trace(
            "publish", event.traceparent, tracestate=event.tracestate, link_origin=False
        )
    )
    with scope:
        if event.traceparent is None and (current := tracing.current_traceparent()):
            event = event.model_copy(update={"traceparent": current[0], "tracestate": current[1]})
        body = event.to_bytes()
        # With a span, the headers carry the publish span's context (a consumer's span is its
        # child, as under faststream's tracing middleware); without one, the event's own.
        traceparent, tracestate = (
            (tracing.current_traceparent() or (event.traceparent, event.tracestate))
            if recording
            else (event.traceparent, event.tracestate)
        )
        headers = framing.headers(
            event.id,
            subject,
            body,
            key=job_key(cfg, event),
            traceparent=traceparent,
            tracestate=tracestate,
        )
        yield event, subject, body, headers


def _messaging(subject: str, event_id: str) -> dict[str, str]:
    """The messaging attributes of a publish span (OpenTelemetry's semantic conventions, as
    faststream's tracing middleware set them)."""
    return {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.message.conversation_id": event_id,
        "messaging.operation": "publish",
    }
