"""JetStream wiring, written once: one service's `Bus` (its broker, publisher and consumers).

Every service builds one `Bus` and registers handlers with `Bus.consumer` or
`Bus.batch_consumer`. The guarantees live in the bus, not in handlers:

* every publish sets ``Nats-Msg-Id`` to the event's deterministic id (JetStream dedupes retries),
  and a publish that goes unanswered or is refused for now (a stream leader election in a
  cluster, a reconnect) is retried for up to ``publish_retry_s`` (`ckpt_ha.bus.publishing`);
  its headers are framed as every producer frames them (`ckpt_ha.contracts.framing`);
* consumers are durable pull consumers with explicit acks and ``ack_wait``; a handler that runs
  long sends in-progress acks automatically, up to its deadline (``handler_deadline_s``), where
  it is cancelled and its message nak'ed (`ckpt_ha.bus.deadline`);
* a service's connection waits for NATS at start and comes back after any outage, however
  long (`ckpt_ha.bus.reconnect`); every JetStream call and publish has a timeout;
* every delivery ends in an ack, a nak with backoff, a park (a version newer than this consumer
  knows) or a dead letter, decided by `ckpt_ha.bus.dead_letter_policy.DeadLetters`, which also
  enforces the delivery cap (JetStream's own ``max_deliver`` is unlimited);
* a batch consumer's messages are admitted, handled in stream order and settled one by one
  (`ckpt_ha.bus.batching`); the broker checks the streams before anything else and lifts an
  older release's cap from its durables (`ckpt_ha.bus.nats_broker`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

from faststream import AckPolicy, Context
from faststream.message import StreamMessage
from faststream.nats import JStream, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext

from ckpt_ha.bus import batching, compat, nats_broker, publishing, stream_reader, usage
from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.batching import BatchHandler
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.dead_letter_policy import ADVISORY_MAX_DELIVERIES, DeadLetters
from ckpt_ha.bus.reconnect import ReconnectBackoff
from ckpt_ha.contracts import CATALOG, Envelope, EventCatalog, EventData, build
from ckpt_ha.contracts.subjects import (
    dead_letter_filter,
    event_filter,
    is_telemetry,
    telemetry_filters,
)
from ckpt_ha.telemetry import logs, tracing

log = logging.getLogger("ckpt_ha.bus")

Handler = Callable[..., Awaitable[None]]
PublishObserver = Callable[[str, float, BaseException | None], None]
"""Told of one publish attempt: its subject, its seconds, its error (None: stored)."""


class Bus:
    """One service's view of the event bus: its broker, its consumers, its publisher."""

    def __init__(
        self,
        cfg: BusConfig,
        service: str,
        catalog: EventCatalog = CATALOG,
        *,
        lasting: bool = False,
    ) -> None:
        """``lasting``: this process runs for long (a service, the runner), so its broker
        waits for NATS at start and reconnects forever after a lost connection; otherwise (a
        command, a test's publisher) a few attempts, then `nats.errors.NoServersError`
        (`BusConfig.connection_policy`)."""
        compat.install_nats_fetch_timeouts()
        compat.install_queued_next_msg()
        compat.install_header_lines()
        self.cfg = cfg
        self.service = service
        self.catalog = catalog
        self.dead_letters = DeadLetters(cfg, service, catalog)
        self._pipelines: list[batching.BatchPipeline] = []
        self.consumers: dict[str, str] = {}
        """Each durable of this bus and the stream it is on."""
        self.on_published: PublishObserver | None = None
        """Told of every publish attempt of `publish` (subject, seconds, error or None): the
        service's publish metrics (`ckpt_ha.runtime.server.publish_metrics`)."""
        self._js_of: tuple[object, JetStreamContext] | None = None
        policy = cfg.connection_policy(lasting=lasting)
        self.reconnects: ReconnectBackoff | None = policy.get("reconnect_to_server_handler")
        """The backoff a lasting bus reconnects with (it counts its attempts)."""
        self.broker = nats_broker.Broker(
            cfg,
            self._pipelines,
            self.consumers,
            cfg.servers,
            security=nats_broker.security(cfg),
            inbox_prefix=cfg.inbox_prefix,
            **policy,
            # Telemetry outermost: the consume span is current while DeadLetters settles, and
            # every publish (follow-ups, dead letters) carries the trace in its headers.
            middlewares=[
                nats_broker.Telemetry(include_messages_counters=False),
                self.dead_letters,
            ],
            graceful_timeout=cfg.graceful_timeout_s,
            name=f"ckpt-ha-{service}",
            **nats_broker.logger_option(),
        )
        self.dead_letters.bind(self.broker)
        self.events = nats_broker.events_stream(cfg)
        self.progress = nats_broker.progress_stream(cfg)
        # Publishers name the streams (declared by the operator's provisioning, not here).
        self.broker.publisher(event_filter(cfg.prefix), stream=self.events, include_in_schema=False)
        self.broker.publisher(
            dead_letter_filter(cfg.prefix),
            stream=nats_broker.dead_letter_stream(cfg),
            include_in_schema=False,
        )

    async def consumer_info(self) -> list[tuple[str, int, int, int]]:
        """(durable, num_pending, num_ack_pending, num_redelivered) of each of this bus's
        consumers, read from JetStream."""
        return await usage.consumer_info(self._js(), self.consumers)

    @property
    def _fetch_inbox(self) -> bytes:
        # faststream's pull subscribers fetch into ``_INBOX.`` unless told otherwise.
        return f"{self.cfg.inbox_prefix}.".encode()

    async def stream_usage(self) -> list[tuple[str, int, int, int]]:
        """(stream, messages, bytes, max_bytes; -1 without a limit) of the event, the
        dead-letter and the progress stream, read from JetStream."""
        return await usage.stream_usage(self._js(), self.cfg)

    async def account_storage(self) -> tuple[int, int]:
        """(file storage used, its limit; -1 or 0 without one) of this bus's JetStream account."""
        return await usage.account_storage(self._js())

    def _js(self) -> JetStreamContext:
        """The broker's connection's JetStream client, made once per connection (each publish
        asks for it)."""
        connection = self.broker.connection
        if self._js_of is None or self._js_of[0] is not connection:
            self._js_of = (connection, connection.jetstream(timeout=self.cfg.request_timeout_s))
        return self._js_of[1]

    def durable_name(self, consumer: str) -> str:
        return f"{self.service}--{consumer}"

    def _stream_for(self, filter_subject: str) -> JStream:
        """A consumer's stream: the progress stream's subjects are consumed there. A filter
        spanning both streams (``<prefix>.ev.>``) cannot be one durable: consume each."""
        if self.cfg.progress_stream and filter_subject in telemetry_filters(self.cfg.prefix):
            return self.progress
        return self.events

    def consumer(
        self,
        consumer: str,
        filter_subject: str,
        *,
        description: str | None = None,
    ) -> Callable[[Handler], Any]:
        """Decorator: a durable pull consumer with explicit acks on ``filter_subject``, on the
        progress stream for a telemetry subject, else on the event stream."""
        durable = self.durable_name(consumer)
        stream = self._stream_for(filter_subject)
        self.consumers[durable] = stream.name

        async def decode(msg: StreamMessage[Any]) -> Envelope[EventData]:
            raw: Msg = msg.raw_message
            event = admit(
                self.cfg,
                self.catalog,
                raw.data,
                raw.subject,
                raw.headers,
                raw.metadata.sequence.stream,
            )
            logs.enter_scope(event)  # inside the dead-letter middleware's scope
            return event

        return self.broker.subscriber(
            filter_subject,
            stream=stream,
            durable=durable,
            pull_sub=PullSub(batch_size=self.cfg.fetch_batch, timeout=self.cfg.fetch_timeout_s),
            inbox_prefix=self._fetch_inbox,
            config=nats_broker.consumer_config(self.cfg),
            ack_policy=AckPolicy.MANUAL,
            decoder=decode,
            title=f"{self.service}:{consumer}",
            description=description,
        )

    def batch_consumer(
        self,
        consumer: str,
        filter_subject: str,
        *,
        payload: Any = None,
        description: str | None = None,
        prompt: bool = False,
    ) -> Callable[[BatchHandler], BatchHandler]:
        """Decorator: like `consumer`, but the handler gets each fetched batch in stream order.

        For projections that gain from doing one round trip per batch instead of per message.
        Bytes that do not decode are dead-lettered before the handler sees the batch; every
        other message is settled (ack / nak / dead letter) by its own result. A handler that
        raises for the whole batch gets its events again one at a time (`batching.isolated`), so one
        bad event never fails its neighbours. ``payload`` is the type of one message, for the
        AsyncAPI document only. A batch is handed over once full or once its linger is over
        (`BusConfig.batch_linger_s`; `BusConfig.prompt_linger_s` when ``prompt``: events someone
        waits on).
        """
        durable = self.durable_name(consumer)
        stream = self._stream_for(filter_subject)
        self.consumers[durable] = stream.name

        def register(handler: BatchHandler) -> BatchHandler:
            pipeline = batching.BatchPipeline(
                lambda raws: batching.admit_batch(
                    raws, durable, self.cfg, self.catalog, self.dead_letters
                ),
                lambda admitted: batching.handle_batch(
                    admitted, handler, durable, self.cfg, self.dead_letters
                ),
            )
            self._pipelines.append(pipeline)

            async def on_batch(
                message: Annotated[NatsBatchMessage, Context("message")], body: Any = None
            ) -> None:
                await pipeline.submit(list(message.raw_message))

            on_batch.__name__ = handler.__name__
            if payload is not None:
                # Documentation only: the decoder yields None; each body is decoded above.
                compat.document_payload(on_batch, "body", list[payload] | None)
            self.broker.subscriber(
                filter_subject,
                stream=stream,
                durable=durable,
                pull_sub=PullSub(
                    batch_size=self.cfg.projection_batch,
                    timeout=self.cfg.prompt_linger_s if prompt else self.cfg.batch_linger_s,
                    batch=True,
                ),
                inbox_prefix=self._fetch_inbox,
                config=nats_broker.consumer_config(self.cfg),
                ack_policy=AckPolicy.MANUAL,
                decoder=batching.raw_batch,  # the catalogue decodes each message in admit_batch
                title=f"{self.service}:{consumer}",
                description=description,
            )(on_batch)
            return handler

        return register

    def watch_max_deliveries(self) -> None:
        """Dead-letter what exhausted ``max_deliver`` without any answer from a handler."""
        for durable, stream in self.consumers.items():
            subject = f"{ADVISORY_MAX_DELIVERIES}.{stream}.{durable}"
            on_advisory = self.dead_letters.on_max_deliveries
            self.broker.subscriber(subject, include_in_schema=False)(on_advisory)

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        """Publish into the event stream (the progress stream, for telemetry), framed, traced
        and retried as `ckpt_ha.bus.publishing.publish` says. Returns the envelope as published."""
        return await publishing.publish(self.cfg, event, self._send)

    async def publish_many(self, events: Sequence[Envelope[EventData]]) -> list[Exception | None]:
        """Publish events at once, their acks awaited together rather than one request after
        another (a burst's decisions: `ckpt_ha.bus.publishing.publish_pipelined`), each framed,
        traced and, when unanswered, retried as `publish` does. Each one's result, in order:
        None once stored, else its error. One retried may land after those sent after it:
        events that must land in order go in successive calls."""
        return await publishing.publish_pipelined(self.cfg, events, self._send_async, self._send)

    async def last_event(self, event_type: str, job_id: str) -> Envelope[EventData] | None:
        """The newest stored event of ``event_type`` about ``job_id`` (`stream_reader.
        last_event`). None also when the stream cannot be read now (logged): a caller uses it to
        wait for what is on its way, never to decide from it alone."""
        js = self._js()
        try:
            return await stream_reader.last_event(js, self.cfg, self.catalog, event_type, job_id)
        except (NatsError, TimeoutError) as exc:
            log.warning("cannot read the last %s of %s: %r", event_type, job_id, exc)
            return None

    async def _send(self, subject: str, body: bytes, headers: Mapping[str, str]) -> object:
        """One JetStream publish, straight on the client (faststream's publish middlewares
        added a second span and headers only its own consumers read, for a third more CPU per
        publish): ``on_published`` observes it as faststream's metrics middleware did. A
        decision names the event stream it must land in; a report
        (`ckpt_ha.contracts.subjects.TELEMETRY`) names none and lands in whichever stream
        captures it: the progress stream once provisioned, the event stream before, so a
        runner's heartbeats keep flowing while an operator migrates the streams under it."""
        stream = None if is_telemetry(self.cfg.prefix, subject) else self.cfg.events_stream
        started = time.perf_counter()
        try:
            ack = await self._js().publish(
                subject,
                body,
                timeout=self.cfg.publish_timeout_s,
                stream=stream,
                headers=dict(headers),
            )
        except Exception as exc:
            if self.on_published is not None:
                self.on_published(subject, time.perf_counter() - started, exc)
            raise
        if self.on_published is not None:
            self.on_published(subject, time.perf_counter() - started, None)
        return ack

    async def _send_async(
        self, subject: str, body: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[Any]:
        """`_send` without waiting for the ack: its future (nats-py's ``publish_async``),
        observed by ``on_published`` when it settles."""
        stream = None if is_telemetry(self.cfg.prefix, subject) else self.cfg.events_stream
        started = time.perf_counter()
        ack: asyncio.Future[Any] = await self._js().publish_async(
            subject, body, stream=stream, headers=dict(headers)
        )
        observe = self.on_published
        if observe is not None:

            def settled(done: asyncio.Future[Any]) -> None:
                error = None if done.cancelled() else done.exception()
                observe(subject, time.perf_counter() - started, error or None)

            ack.add_done_callback(settled)
        return ack

    async def publish_caused_by(
        self,
        cause: Envelope[EventData],
        datas: Sequence[EventData],
        *,
        source: str,
        time: datetime,
        key: str | None = None,
    ) -> None:
        """Publish the follow-ups of ``cause``: ids keyed on it, or on ``key`` when given (a
        redelivered cause yields the same ids, so JetStream drops the repeats) and its trace
        carried on: a follow-up is a child of the current span (the one handling the cause, or
        one a handler opened in a checkpoint's own trace), else of the cause's own context."""
        current = tracing.current_traceparent()
        traceparent, tracestate = current or (cause.traceparent, cause.tracestate)
        for data in datas:
            await self.publish(
                build(
                    data,
                    source=source,
                    time=time,
                    key=key or cause.id,
                    traceparent=traceparent,
                    tracestate=tracestate,
                )
            )
