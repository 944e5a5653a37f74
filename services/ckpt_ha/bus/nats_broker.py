"""The faststream broker a `ckpt_ha.bus.broker.Bus` runs on, and what it is built from.

The streams as this process refers to them (never declared here: `ckpt_ha.bus.streams`
provisions them under the operator principal, the broker checks them at start), the consumer
configuration every durable gets, the login, the tracing middleware, and the broker itself:
it checks the streams and lifts an older release's delivery cap before it consumes or
publishes anything, and lets batch pipelines finish before it stops.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faststream import BaseMiddleware
from faststream.nats import ConsumerConfig, JStream, NatsBroker
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.security import NatsSecurity, NatsUserPassword
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from ckpt_ha.bus import delivery, streams
from ckpt_ha.bus.batching import BatchPipeline
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts.subjects import dead_letter_filter, event_filter, telemetry_filters
from ckpt_ha.credentials import reveal
from ckpt_ha.telemetry import logs, tracing

log = logging.getLogger("ckpt_ha.bus")

UNLIMITED = -1
"""JetStream's ``max_deliver`` of our durables: the cap is enforced by `DeadLetters`."""


def events_stream(cfg: BusConfig) -> JStream:
    """The event log, as this process refers to it: never declared here (`ckpt_ha.bus.streams`
    provisions it under the operator principal; the broker checks it at start)."""
    return JStream(cfg.events_stream, subjects=[event_filter(cfg.prefix)], declare=False)


def progress_stream(cfg: BusConfig) -> JStream:
    """The progress stream (telemetry: ``job.progress``, ``job.heartbeat``), never declared
    here either. Without one (``cfg.progress_stream`` empty) telemetry is in the event stream."""
    if not cfg.progress_stream:
        return events_stream(cfg)
    return JStream(cfg.progress_stream, subjects=telemetry_filters(cfg.prefix), declare=False)


def dead_letter_stream(cfg: BusConfig) -> JStream:
    return JStream(cfg.dead_letter_stream, subjects=[dead_letter_filter(cfg.prefix)], declare=False)


def consumer_config(cfg: BusConfig) -> ConsumerConfig:
    """Explicit acks, ``ack_wait``; JetStream's ``max_deliver`` unlimited, so a parked
    message is redelivered for as long as it waits (`DeadLetters` caps the rest)."""
    return ConsumerConfig(
        ack_policy=JsAckPolicy.EXPLICIT,
        ack_wait=cfg.ack_wait_s,
        max_deliver=UNLIMITED,
        deliver_policy=DeliverPolicy.ALL,
    )


class Telemetry(NatsTelemetryMiddleware):
    """faststream's tracing middleware, except around a fetched batch while no span is recorded.

    For a batch, faststream's middleware reads every message's headers for baggage and links
    to build one span; a batch consumer enters each event's own trace itself
    (`Bus.batch_consumer`). With tracing off that span records nothing and only costs: the
    batch then goes straight to the handler. A publish through the broker (``msg`` None: only
    dead letters; `Bus.publish` uses the JetStream client itself and traces itself) with
    tracing off passes through too: its headers already carry the original's trace context.
    Single messages consumed are unchanged."""

    def __call__(self, msg: Any, /, *, context: Any) -> Any:
        if (msg is None or isinstance(msg, list)) and not tracing.recording():
            return BaseMiddleware(msg, context=context)
        return super().__call__(msg, context=context)


def logger_option() -> dict[str, logging.Logger]:
    """The broker's logger when `ckpt_ha.telemetry.logs` asks for one (JSON lines), else
    faststream's own."""
    ours = logs.library_logger("ckpt_ha.bus.access")
    return {} if ours is None else {"logger": ours}


class Broker(NatsBroker):
    """NatsBroker that checks the streams before it consumes or publishes anything (refusing a
    wrong one, never rewriting it), and lets batch pipelines finish before it stops consuming
    and disconnects."""

    def __init__(
        self,
        cfg: BusConfig,
        pipelines: list[BatchPipeline],
        durables: dict[str, str],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._ckpt_cfg = cfg
        self._ckpt_pipelines = pipelines
        self._ckpt_durables = durables
        self._ckpt_graceful = float(kwargs.get("graceful_timeout") or 15.0)
        self.on_stream: Callable[[str], Awaitable[None]] | None = None
        """Called at start with the event stream's identity (`streams.identity`), once checked:
        the registrar records which stream the registry is built from."""

    async def start(self) -> None:
        await self.connect()
        server = self.connection.connected_server_version
        version = (server.major, server.minor, server.patch)
        if delivery.counts_may_go_back(version):
            log.warning(
                "nats-server %s can count a redelivery as a first delivery (fixed in %s): a "
                "failing event may be retried past max_deliver=%s; upgrade the server",
                ".".join(map(str, version)),
                ".".join(map(str, delivery.COUNTS_FIXED_IN)),
                self._ckpt_cfg.max_deliver,
            )
        js = self.connection.jetstream(timeout=self._ckpt_cfg.request_timeout_s)
        await streams.check(js, self._ckpt_cfg)
        await uncap_durables(js, self._ckpt_cfg, self._ckpt_durables)
        if self.on_stream is not None:
            try:
                await self.on_stream(await streams.identity(js, self._ckpt_cfg))
            except Exception as exc:  # noqa: BLE001 - recorded at the next start instead
                log.warning("the event stream's identity was not recorded: %r", exc)
        for pipeline in self._ckpt_pipelines:
            pipeline.reopen()
        await super().start()

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        for pipeline in self._ckpt_pipelines:
            await pipeline.drain(self._ckpt_graceful)
        await super().stop(*args, **kwargs)


async def uncap_durables(js: JetStreamContext, cfg: BusConfig, durables: Mapping[str, str]) -> None:
    """Lift JetStream's own ``max_deliver`` from durables an older release created with one
    (nats-py never updates an existing durable's configuration): with a cap, JetStream would
    stop redelivering a parked message. Only ``max_deliver`` changes. ``durables``: each
    durable's stream."""
    for durable, stream in durables.items():
        try:
            info = await js.consumer_info(stream, durable)
        except NotFoundError:
            continue  # created by faststream with `consumer_config`
        if info.config.max_deliver in (None, 0, UNLIMITED):
            continue
        log.info("durable %s: max_deliver %s -> unlimited", durable, info.config.max_deliver)
        await js.add_consumer(
            stream, config=dataclasses.replace(info.config, max_deliver=UNLIMITED)
        )


def security(cfg: BusConfig) -> NatsSecurity | None:
    """Who the broker logs in as and the TLS context it verifies the server with."""
    tls = cfg.tls()
    if cfg.user is not None:
        return NatsUserPassword(cfg.user, reveal(cfg.password) or "", ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None
