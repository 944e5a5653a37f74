"""JetStream wiring, written once: streams, publishing, durable pull consumers, dead-lettering.

Every service builds one `Bus` (its broker, publisher and consumers) and registers handlers with
`Bus.consumer` or `Bus.batch_consumer`. The guarantees live here, not in handlers:

* every publish sets ``Nats-Msg-Id`` to the event's deterministic id (JetStream dedupes retries),
  and a publish that goes unanswered or is refused for now (a stream leader election in a
  cluster, a reconnect) is retried for up to ``publish_retry_s`` (`publish_retrying`);
* consumers are durable pull consumers with explicit acks and ``ack_wait``; a handler that runs
  long sends in-progress acks automatically, up to its deadline (``handler_deadline_s``), where
  it is cancelled and its message nak'ed (`ckpt_ha.bus.deadline`);
* a service's connection waits for NATS at start and comes back after any outage, however
  long (`ckpt_ha.bus.reconnect`); every JetStream call and publish has a timeout;
* faststream's own ack logic is off (`AckPolicy.MANUAL`); `DeadLetters` decides instead:
  success → ack; `TransientError` or an unexpected exception → nak with backoff, and on the last
  allowed delivery (``max_deliver``) → dead-letter; a payload that fails validation, an unknown
  type, an older version this consumer does not know, or a `PermanentError` → dead-letter at
  once. A dead letter keeps the original bytes and headers and adds the error, its code, the
  delivery count, the consumer and the stream sequence;
* an event of a version newer than this consumer knows is parked (`ckpt_ha.bus.delivery`):
  nak'ed with ``park_delay_s`` until a consumer that knows it takes it (a rolling upgrade);
* so JetStream's own ``max_deliver`` is unlimited and the cap is ours: a message delivered past
  the cap without any answer (a crashed or hung handler, a delivery lost in a pull) is
  dead-lettered before its handler runs again. Durables created with a finite cap are brought to
  this configuration at start; for one that still has a cap, JetStream's max-deliveries advisory
  dead-letters what exhausted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

from faststream import AckPolicy, BaseMiddleware, Context
from faststream.message import StreamMessage
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.message import NatsBatchMessage, NatsMessage
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.security import NatsSecurity, NatsUserPassword
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NoStreamResponseError, NotFoundError, ServiceUnavailableError
from pydantic import ValidationError

from ckpt_ha.bus import compat, delivery, letters, stream_reader, streams
from ckpt_ha.bus.admission import admit, signed_headers, subject_of
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.deadline import HandlerDeadlineExceeded, keep_alive_task, within_deadline
from ckpt_ha.bus.reconnect import ReconnectBackoff
from ckpt_ha.contracts import CATALOG, Envelope, EventCatalog, EventData, build
from ckpt_ha.contracts.errors import ContractError, UnsupportedEventVersion
from ckpt_ha.contracts.subjects import (
    dead_letter_filter,
    dead_letter_subject,
    event_filter,
    is_telemetry,
    parse_event_subject,
    telemetry_filters,
)
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.core.errors import DependencyNotReady, PermanentError
from ckpt_ha.credentials import reveal
from ckpt_ha.telemetry import logs, tracing

log = logging.getLogger("ckpt_ha.bus")

ADVISORY_MAX_DELIVERIES = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
UNLIMITED = -1
"""JetStream's ``max_deliver`` of our durables: the cap is enforced by `DeadLetters`."""


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


class DeadLetters:
    """Middleware factory (faststream calls it once per message) plus the dead-letter publisher."""

    def __init__(
        self,
        cfg: BusConfig,
        service: str,
        catalog: EventCatalog = CATALOG,
        clock: Clock = utc_now,
    ) -> None:
        self.cfg = cfg
        self.service = service
        self.catalog = catalog
        """What this consumer knows: a newer version of a known type is parked."""
        self.clock = clock
        self._broker: NatsBroker | None = None
        self._order: dict[str, asyncio.Lock] = {}
        self.on_outcome: Callable[[str, str], None] = lambda consumer, outcome: None
        """Hook for metrics: called with (consumer, 'ack'|'nak'|'parked'|'dead_letter')."""
        self.on_dead_letter: Callable[[str, str], None] = lambda consumer, code: None
        """Hook for metrics: called with (consumer, error code) for every stored dead letter."""
        self.on_park: Callable[[str, str], None] = lambda consumer, event: None
        """Hook for metrics: called with (consumer, ``type.vN``) for every parked delivery."""

    def bind(self, broker: NatsBroker) -> None:
        self._broker = broker

    def ordering_lock(self, consumer: str) -> asyncio.Lock:
        """faststream starts a fetched batch's messages as concurrent tasks, in stream order.

        Taking this FIFO lock first thing makes one consumer handle them one at a time in that
        order, so a projection sees a checkpoint's events in the order they were published.
        Scale out with more consumers (partitioned by job), not with concurrency inside one.
        """
        return self._order.setdefault(consumer, asyncio.Lock())

    def __call__(self, msg: Any, /, *, context: Any) -> _DeadLetterScope:
        return _DeadLetterScope(msg, context=context, letters=self)

    async def settle(self, raw: Msg, error: BaseException | None, consumer: str) -> None:
        """End one delivery: ack on success; park a newer version; otherwise nak with backoff or
        dead-letter."""
        if error is None:
            await raw.ack()
            self.on_outcome(consumer, "ack")
            return
        meta = raw.metadata
        if delivery.newer_than_known(error, parse_event_subject(self.cfg.prefix, raw.subject)):
            await self._park(raw, error, consumer)
            return
        permanent = _classify(error)
        attempts = self.attempts(raw)
        if permanent is None and attempts < self.cfg.max_deliver:
            delay = self._nak_delay(raw, error, attempts)
            log.info(
                "nak seq=%s consumer=%s attempt=%s delay=%.1fs: %r",
                meta.sequence.stream,
                consumer,
                attempts,
                delay,
                error,
            )
            await raw.nak(delay=delay)
            self.on_outcome(consumer, "nak")
            tracing.annotate(**{"ckpt_ha.outcome": "nak", "ckpt_ha.error": repr(error)[:500]})
            return
        code, text = permanent or ("max_deliver", f"last delivery failed: {error!r}")
        await self._dead_letter(raw, code, text, consumer, attempts)

    def _nak_delay(self, raw: Msg, error: BaseException, attempts: int) -> float:
        """The back-off; the last one of an event waiting for an earlier one lasts until the
        earlier one can have come back from a consumer that died with it
        (`ckpt_ha.bus.delivery.nak_delay`)."""
        return delivery.nak_delay(
            self.cfg.backoff(attempts),
            attempts,
            self.cfg.max_deliver,
            waits_for_earlier=isinstance(error, DependencyNotReady) and error.in_stream,
            age_s=(self.clock() - raw.metadata.timestamp).total_seconds(),
            bound_s=self.cfg.redelivery_bound_s,
        )

    def attempts(self, raw: Msg) -> int:
        """This delivery's number against the cap: JetStream's count less the parks it may
        include (`ckpt_ha.bus.delivery.attempts`)."""
        meta = raw.metadata
        where = parse_event_subject(self.cfg.prefix, raw.subject)
        return delivery.attempts(
            meta.num_delivered,
            meta.timestamp,
            self.clock(),
            parkable=delivery.parkable(self.catalog, where),
            park_delay_s=self.cfg.park_delay_s,
        )

    async def past_cap(self, raw: Msg, consumer: str) -> bool:
        """Before a handler runs: True (and the message dead-lettered) when it was delivered
        past the cap already, so the earlier deliveries got no answer at all (the handler
        crashed the process or hung, or the delivery was lost in a pull). A message this
        consumer would park is never past the cap: it never reaches a handler here."""
        if raw.metadata.num_delivered <= self.cfg.max_deliver:
            return False  # the common case, cheaply: `attempts` never exceeds this count
        attempts = self.attempts(raw)
        if attempts <= self.cfg.max_deliver:
            return False
        if delivery.parks_here(self.catalog, parse_event_subject(self.cfg.prefix, raw.subject)):
            return False
        text = (
            f"delivered {attempts} times without an answer (the handler crashed, hung, or the "
            "delivery was lost)"
        )
        await self._dead_letter(raw, "max_deliver", text, consumer, attempts)
        return True

    async def _park(self, raw: Msg, error: BaseException, consumer: str) -> None:
        """Leave a newer version for a consumer that knows it: nak'ed with the park delay,
        never dead-lettered for being new."""
        meta = raw.metadata
        assert isinstance(error, UnsupportedEventVersion)
        event = f"{error.event_type}.v{error.version}"
        log.info(
            "parked seq=%s consumer=%s: %s is newer than this consumer knows %s",
            meta.sequence.stream,
            consumer,
            event,
            error.known,
        )
        await raw.nak(delay=self.cfg.park_delay_s)
        self.on_outcome(consumer, "parked")
        self.on_park(consumer, event)
        tracing.annotate(**{"ckpt_ha.outcome": "parked", "ckpt_ha.event": event})

    async def _dead_letter(
        self, raw: Msg, code: str, text: str, consumer: str, attempts: int
    ) -> None:
        meta = raw.metadata
        tracing.fail(text, code=code)
        try:
            await self.publish(
                raw,
                code=code,
                error=text,
                delivered=meta.num_delivered,
                consumer=consumer,
                stream_seq=meta.sequence.stream,
            )
        except Exception:
            log.exception("dead letter not stored; nak instead")
            await raw.nak(delay=self.cfg.backoff(attempts))
            self.on_outcome(consumer, "nak")
            return
        await raw.term()  # JetStream stops redelivering
        self.on_outcome(consumer, "dead_letter")

    async def publish(
        self,
        raw: Msg,
        *,
        code: str,
        error: str,
        delivered: int,
        consumer: str,
        stream_seq: int,
    ) -> None:
        """Store the original bytes and headers with the reason; deduped per (seq, consumer)."""
        if self._broker is None:
            raise RuntimeError("DeadLetters used before bind()")
        headers = letters.original_headers(raw.headers)
        headers.update(
            {
                "Nats-Msg-Id": f"dlq:{_stream_of(raw, self.cfg)}:{stream_seq}:{consumer}",
                letters.ERROR_CODE: code,
                letters.ERROR: error[:2000],
                letters.DELIVERY_COUNT: str(delivered),
                letters.CONSUMER: consumer,
                letters.STREAM_SEQ: str(stream_seq),
                letters.ORIGINAL_SUBJECT: raw.subject,
            }
        )
        await self._broker.publish(
            raw.data,
            dead_letter_subject(self.cfg.prefix, self.service, consumer),
            headers=headers,
            stream=self.cfg.dead_letter_stream,
            timeout=self.cfg.publish_timeout_s,
        )
        self.on_dead_letter(consumer, code)
        log.warning(
            "dead-lettered seq=%s consumer=%s code=%s: %s", stream_seq, consumer, code, error
        )


def _stream_of(raw: Msg, cfg: BusConfig) -> str:
    """The stream a delivered message is stored in (its subject's, for one read by sequence)."""
    try:
        return raw.metadata.stream
    except Exception:  # noqa: BLE001 - not a JetStream delivery (an advisory's stored message)
        return cfg.stream_of(raw.subject)


def _classify(exc: BaseException) -> tuple[str, str] | None:
    """(code, text) when the failure is permanent; None when a retry may succeed. A version
    newer than the consumer knows is neither: `DeadLetters.settle` parks it first."""
    if isinstance(exc, ContractError):
        return exc.code, str(exc)
    if isinstance(exc, ValidationError):
        return "malformed", str(exc).replace("\n", " ")[:2000]
    if isinstance(exc, PermanentError):
        return getattr(exc, "code", "permanent"), str(exc)
    return None


class _DeadLetterScope(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, letters: DeadLetters) -> None:
        super().__init__(msg, context=context)
        self.letters = letters

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        if not isinstance(msg, NatsMessage) or not msg.raw_message.reply:
            return await call_next(msg)  # core NATS (advisories): nothing to ack
        raw = msg.raw_message
        meta = raw.metadata
        consumer = meta.consumer or "?"
        async with self.letters.ordering_lock(consumer):
            return await self._handle(call_next, msg, consumer)

    async def _handle(
        self,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: NatsMessage,
        consumer: str,
    ) -> Any:
        raw = msg.raw_message
        cfg = self.letters.cfg
        if await self.letters.past_cap(raw, consumer):
            return None
        heartbeat = keep_alive_task([raw], cfg.ack_wait_s, cfg.handler_deadline_s)
        try:
            result = await within_deadline(call_next(msg), cfg.handler_deadline_s)
        except Exception as exc:  # noqa: BLE001 - every failure must end in ack, nak or dead letter
            await self.letters.settle(raw, exc, consumer)
            return None
        finally:
            heartbeat.cancel()
        await self.letters.settle(raw, None, consumer)
        return result


Handler = Callable[..., Awaitable[None]]


def _counts(raw: Msg) -> tuple[int, int]:
    """(times delivered, stream sequence) by nats-py's own parse (`delivery.counts` read none)."""
    meta = raw.metadata
    return meta.num_delivered, meta.sequence.stream


async def _raw_batch(msg: StreamMessage[Any]) -> None:
    """Batch decoder that decodes nothing: faststream would JSON-parse every body once more."""


BatchHandler = Callable[[list[Envelope[EventData]]], Awaitable[Sequence[BaseException | None]]]
"""Handles a fetched batch in stream order; returns one result per event (None = success)."""


async def _isolated(
    handler: BatchHandler, events: list[Envelope[EventData]]
) -> Sequence[BaseException | None]:
    """The handler's result for each event. When the handler fails for the batch as a whole
    (one event it cannot take, or an outage), each event is handled again on its own, in
    stream order, so the one that fails is settled by its own error and never takes its
    neighbours with it (an outage then fails each, and each is nak'ed)."""
    if not events:
        return []
    try:
        return await handler(events)
    except Exception as exc:  # noqa: BLE001 - isolate below
        if len(events) == 1:
            return [exc]
        log.warning("batch of %s failed (%r); handling its events one by one", len(events), exc)
    results: list[BaseException | None] = []
    for event in events:
        try:
            [result] = await handler([event])
        except Exception as exc:  # noqa: BLE001 - this event's own failure
            result = exc
        results.append(result)
    return results


@dataclasses.dataclass
class _Admitted:
    """A fetched batch once admitted: its events in stream order, the messages they came from,
    and the in-progress acks that keep all of them held until they are settled."""

    events: list[Envelope[EventData]]
    raws: list[Msg]
    heartbeat: asyncio.Task[None]


class _BatchPipeline:
    """Handles a consumer's batches one after another, in fetch order, on one worker task.

    faststream fetches the next batch only after the handler returns. Here its task admits the
    batch (signature, decoding: ``admit``) and hands it to this worker, so the next fetch and
    its admission overlap with the current batch's Redis round trips, while batches are still
    handled strictly in order. At most one admitted batch waits behind the one in progress.
    """

    def __init__(
        self,
        admit: Callable[[list[Msg]], Awaitable[_Admitted]],
        process: Callable[[_Admitted], Awaitable[None]],
    ) -> None:
        self.admit = admit
        self.process = process
        self.queue: asyncio.Queue[_Admitted] = asyncio.Queue(maxsize=1)
        self.worker: asyncio.Task[None] | None = None
        self.closing = False

    async def submit(self, raws: list[Msg]) -> None:
        if self.closing:
            return  # not acked: JetStream redelivers it to the next consumer instance
        admitted = await self.admit(raws)
        if self.closing:
            admitted.heartbeat.cancel()
            return
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._run())
        try:
            await self.queue.put(admitted)
        except BaseException:  # cancelled while waiting (faststream stopping): not handed over
            admitted.heartbeat.cancel()
            raise
        if self.closing and self.worker is None:
            self._discard()  # handed over after the drain: nobody will handle it

    async def _run(self) -> None:
        while True:
            admitted = await self.queue.get()
            try:
                await self.process(admitted)
            except Exception:
                log.exception("batch failed; its unsettled messages will be redelivered")
            finally:
                admitted.heartbeat.cancel()
                self.queue.task_done()

    async def drain(self, within_s: float) -> None:
        """Finish what was handed over (for at most ``within_s``), then stop the worker."""
        self.closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), within_s)
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker
            self.worker = None
        self._discard()

    def _discard(self) -> None:
        """Drop what waits in the queue: left unsettled, redelivered after ``ack_wait``."""
        while not self.queue.empty():
            self.queue.get_nowait().heartbeat.cancel()
            self.queue.task_done()

    def reopen(self) -> None:
        """Take batches again (the broker starts after a stop): closed from `drain` until
        then, so nothing handed over while faststream stops starts another worker."""
        self._discard()
        self.closing = False


class _Telemetry(NatsTelemetryMiddleware):
    """faststream's tracing middleware, except around a fetched batch while no span is recorded.

    For a batch, faststream's middleware reads every message's headers for baggage and links
    to build one span; a batch consumer enters each event's own trace itself
    (`Bus.batch_consumer`). With tracing off that span records nothing and only costs: the
    batch then goes straight to the handler. A publish (``msg`` None) with tracing off passes
    through too: `Bus.publish` already put the event's trace context in its headers, which is
    what the middleware's non-recording span would have injected. Single messages consumed
    are unchanged."""

    def __call__(self, msg: Any, /, *, context: Any) -> Any:
        if (msg is None or isinstance(msg, list)) and not tracing.recording():
            return BaseMiddleware(msg, context=context)
        return super().__call__(msg, context=context)


def _logger_option() -> dict[str, logging.Logger]:
    """The broker's logger when `ckpt_ha.telemetry.logs` asks for one (JSON lines), else
    faststream's own."""
    ours = logs.library_logger("ckpt_ha.bus.access")
    return {} if ours is None else {"logger": ours}


class _Broker(NatsBroker):
    """NatsBroker that checks the streams before it consumes or publishes anything (refusing a
    wrong one, never rewriting it), and lets batch pipelines finish before it stops consuming
    and disconnects."""

    def __init__(
        self,
        cfg: BusConfig,
        pipelines: list[_BatchPipeline],
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
            continue  # created by faststream with `Bus._consumer_config`
        if info.config.max_deliver in (None, 0, UNLIMITED):
            continue
        log.info("durable %s: max_deliver %s -> unlimited", durable, info.config.max_deliver)
        await js.add_consumer(
            stream, config=dataclasses.replace(info.config, max_deliver=UNLIMITED)
        )


def _security(cfg: BusConfig) -> NatsSecurity | None:
    """Who the broker logs in as and the TLS context it verifies the server with."""
    tls = cfg.tls()
    if cfg.user is not None:
        return NatsUserPassword(cfg.user, reveal(cfg.password) or "", ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


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
        self._pipelines: list[_BatchPipeline] = []
        self.consumers: dict[str, str] = {}
        """Each durable of this bus and the stream it is on."""
        policy = cfg.connection_policy(lasting=lasting)
        self.reconnects: ReconnectBackoff | None = policy.get("reconnect_to_server_handler")
        """The backoff a lasting bus reconnects with (it counts its attempts)."""
        self.broker = _Broker(
            cfg,
            self._pipelines,
            self.consumers,
            cfg.servers,
            security=_security(cfg),
            inbox_prefix=cfg.inbox_prefix,
            **policy,
            # Telemetry outermost: the consume span is current while DeadLetters settles, and
            # every publish (follow-ups, dead letters) carries the trace in its headers.
            middlewares=[
                _Telemetry(include_messages_counters=False),
                self.dead_letters,
            ],
            graceful_timeout=cfg.graceful_timeout_s,
            name=f"ckpt-ha-{service}",
            **_logger_option(),
        )
        self.dead_letters.bind(self.broker)
        self.events = events_stream(cfg)
        self.progress = progress_stream(cfg)
        # Publishers name the streams (declared by the operator's provisioning, not here).
        self.broker.publisher(event_filter(cfg.prefix), stream=self.events, include_in_schema=False)
        self.broker.publisher(
            dead_letter_filter(cfg.prefix),
            stream=dead_letter_stream(cfg),
            include_in_schema=False,
        )

    async def consumer_info(self) -> list[tuple[str, int, int, int]]:
        """(durable, num_pending, num_ack_pending, num_redelivered) of each of this bus's
        consumers, read from JetStream."""
        js = self.broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
        found: list[tuple[str, int, int, int]] = []
        for durable, stream in self.consumers.items():
            info = await js.consumer_info(stream, durable)
            pending, acks = info.num_pending or 0, info.num_ack_pending or 0
            found.append((durable, pending, acks, info.num_redelivered or 0))
        return found

    @property
    def _fetch_inbox(self) -> bytes:
        # faststream's pull subscribers fetch into ``_INBOX.`` unless told otherwise.
        return f"{self.cfg.inbox_prefix}.".encode()

    async def stream_usage(self) -> list[tuple[str, int, int, int]]:
        """(stream, messages, bytes, max_bytes; -1 without a limit) of the event, the
        dead-letter and the progress stream, read from JetStream."""
        js = self.broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
        found: list[tuple[str, int, int, int]] = []
        names = (self.cfg.events_stream, self.cfg.dead_letter_stream, self.cfg.progress_stream)
        for stream in filter(None, names):
            info = await js.stream_info(stream)
            limit = info.config.max_bytes
            found.append(
                (stream, info.state.messages, info.state.bytes, -1 if limit is None else limit)
            )
        return found

    async def account_storage(self) -> tuple[int, int]:
        """(file storage used, its limit; -1 or 0 without one) of this bus's JetStream account."""
        js = self.broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
        info = await js.account_info()
        return info.storage, info.limits.max_storage

    def durable_name(self, consumer: str) -> str:
        return f"{self.service}--{consumer}"

    def _consumer_config(self) -> ConsumerConfig:
        """Explicit acks, ``ack_wait``; JetStream's ``max_deliver`` unlimited, so a parked
        message is redelivered for as long as it waits (`DeadLetters` caps the rest)."""
        return ConsumerConfig(
            ack_policy=JsAckPolicy.EXPLICIT,
            ack_wait=self.cfg.ack_wait_s,
            max_deliver=UNLIMITED,
            deliver_policy=DeliverPolicy.ALL,
        )

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
            return admit(
                self.cfg,
                self.catalog,
                raw.data,
                raw.subject,
                raw.headers,
                raw.metadata.sequence.stream,
            )

        return self.broker.subscriber(
            filter_subject,
            stream=stream,
            durable=durable,
            pull_sub=PullSub(batch_size=self.cfg.fetch_batch, timeout=self.cfg.fetch_timeout_s),
            inbox_prefix=self._fetch_inbox,
            config=self._consumer_config(),
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
    ) -> Callable[[BatchHandler], BatchHandler]:
        """Decorator: like `consumer`, but the handler gets each fetched batch in stream order.

        For projections that gain from doing one round trip per batch instead of per message.
        Bytes that do not decode are dead-lettered before the handler sees the batch; every
        other message is settled (ack / nak / dead letter) by its own result. A handler that
        raises for the whole batch gets its events again one at a time (`_isolated`), so one
        bad event never fails its neighbours. ``payload`` is the type of one message, for the
        AsyncAPI document only.
        """
        durable = self.durable_name(consumer)
        stream = self._stream_for(filter_subject)
        self.consumers[durable] = stream.name

        def register(handler: BatchHandler) -> BatchHandler:
            pipeline = _BatchPipeline(
                lambda raws: self._admit_batch(raws, durable),
                lambda admitted: self._handle_batch(admitted, handler, durable),
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
                    timeout=self.cfg.batch_linger_s,
                    batch=True,
                ),
                inbox_prefix=self._fetch_inbox,
                config=self._consumer_config(),
                ack_policy=AckPolicy.MANUAL,
                decoder=_raw_batch,  # the catalogue decodes each message in _admit_batch
                title=f"{self.service}:{consumer}",
                description=description,
            )(on_batch)
            return handler

        return register

    async def _admit_batch(self, raws: list[Msg], consumer: str) -> _Admitted:
        """Admit a fetched batch (`admit`): what fails admission, or was delivered past the
        cap, is settled here; in-progress acks hold the rest from now until it is settled."""
        max_deliver = self.cfg.max_deliver
        heartbeat = keep_alive_task(raws, self.cfg.ack_wait_s, self.cfg.handler_deadline_s)
        events: list[Envelope[EventData]] = []
        decoded: list[Msg] = []
        try:
            for raw in raws:
                delivered, seq = delivery.counts(raw.reply) or _counts(raw)
                # Past the cap only when delivered more often (`past_cap` excuses parks).
                if delivered > max_deliver and await self.dead_letters.past_cap(raw, consumer):
                    continue
                try:
                    events.append(
                        admit(self.cfg, self.catalog, raw.data, raw.subject, raw.headers, seq)
                    )
                    decoded.append(raw)
                except ContractError as exc:
                    await self._settle_failed(raw, exc, consumer)
        except BaseException:
            heartbeat.cancel()
            raise
        return _Admitted(events, decoded, heartbeat)

    async def _handle_batch(
        self, admitted: _Admitted, handler: BatchHandler, consumer: str
    ) -> None:
        """Handle an admitted batch, then settle each message by its own event's result."""
        results: Sequence[BaseException | None]
        try:
            results = await within_deadline(
                _isolated(handler, admitted.events), self.cfg.handler_deadline_s
            )
        except HandlerDeadlineExceeded as exc:
            results = [exc] * len(admitted.events)  # none settled yet: every one is nak'ed
        for raw, result in zip(admitted.raws, results, strict=True):
            if result is None:
                await self.dead_letters.settle(raw, None, consumer)
            else:
                await self._settle_failed(raw, result, consumer)

    async def _settle_failed(self, raw: Msg, error: BaseException, consumer: str) -> None:
        """Nak, park or dead-letter one message of a batch in its own trace (the one its
        ``traceparent`` header names), as a per-message consumer's span would: what is logged
        about it (a dead letter's warning) carries that trace's id."""
        headers = raw.headers or {}
        with tracing.continue_trace(
            f"settle {consumer}",
            headers.get("traceparent"),
            tracestate=headers.get("tracestate"),
            link_origin=False,
        ):
            await self.dead_letters.settle(raw, error, consumer)

    def watch_max_deliveries(self) -> None:
        """Dead-letter what exhausted ``max_deliver`` without any answer from a handler."""
        for durable, stream in self.consumers.items():
            subject = f"{ADVISORY_MAX_DELIVERIES}.{stream}.{durable}"
            self.broker.subscriber(subject, include_in_schema=False)(self._on_max_deliveries)

    async def _on_max_deliveries(self, advisory: dict[str, Any]) -> None:
        seq = int(advisory["stream_seq"])
        consumer = str(advisory["consumer"])
        stream = str(advisory.get("stream") or self.cfg.events_stream)
        js = self.broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
        stored = await js.get_msg(stream, seq)
        raw = Msg(
            self.broker.connection,
            subject=stored.subject or "",
            data=stored.data or b"",
            headers=dict(stored.headers or {}),
        )
        await self.dead_letters.publish(
            raw,
            code="max_deliver",
            error="max deliveries reached without an ack (handler crashed or timed out)",
            delivered=int(advisory.get("deliveries", self.cfg.max_deliver)),
            consumer=consumer,
            stream_seq=seq,
        )

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        """Publish into the event stream (the progress stream, for telemetry); ``Nats-Msg-Id`` =
        event id, so retries are deduped (an unanswered publish is retried: `publish_retrying`).

        Traced: the publish is a child of the envelope's ``traceparent`` when it has one, else
        of the current span (a new trace when there is none); an envelope without a
        ``traceparent`` gets this span's. Returns the envelope as published.
        """
        subject = subject_of(self.cfg, event)
        recording = tracing.recording()
        # With no span to record, the event's own context is made current (no span objects):
        # the headers then carry it as the no-op span and faststream's middleware would
        # (`_Telemetry`), and what is logged meanwhile carries its trace id.
        scope = (
            tracing.tracer().start_as_current_span(
                f"publish {event.event_type}",
                context=tracing.context_of(event.traceparent, event.tracestate),
                attributes=tracing.event_attributes(event),
            )
            if recording
            else tracing.continue_trace(
                "publish", event.traceparent, tracestate=event.tracestate, link_origin=False
            )
        )
        with scope:
            if event.traceparent is None and (current := tracing.current_traceparent()):
                event = event.model_copy(
                    update={"traceparent": current[0], "tracestate": current[1]}
                )
            headers = {"Nats-Msg-Id": event.id}
            if event.traceparent:
                # With a span, faststream's telemetry middleware replaces this with its own
                # (child) span's; without one, nothing else sets the trace headers.
                headers["traceparent"] = event.traceparent
                if not recording and event.tracestate:
                    headers["tracestate"] = event.tracestate
            body = event.to_bytes()
            signed = signed_headers(self.cfg, event, body, headers)
            await publish_retrying(
                lambda: self._send(subject, body, signed),
                self.cfg,
                f"{event.event_type} {event.id}",
            )
        return event

    async def last_event(self, event_type: str, job_id: str) -> Envelope[EventData] | None:
        """The newest stored event of ``event_type`` about ``job_id`` (`stream_reader.
        last_event`). None also when the stream cannot be read now (logged): a caller uses it to
        wait for what is on its way, never to decide from it alone."""
        js = self.broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
        try:
            return await stream_reader.last_event(js, self.cfg, self.catalog, event_type, job_id)
        except (NatsError, TimeoutError) as exc:
            log.warning("cannot read the last %s of %s: %r", event_type, job_id, exc)
            return None

    async def _send(self, subject: str, body: bytes, headers: Mapping[str, str]) -> object:
        """One JetStream publish. A decision names the event stream it must land in; a report
        (`ckpt_ha.contracts.subjects.TELEMETRY`) names none and lands in whichever stream
        captures it: the progress stream once provisioned, the event stream before, so a
        runner's heartbeats keep flowing while an operator migrates the streams under it."""
        if is_telemetry(self.cfg.prefix, subject):
            js = self.broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
            return await js.publish(
                subject, body, timeout=self.cfg.publish_timeout_s, headers=dict(headers)
            )
        return await self.broker.publish(
            body,
            subject,
            headers=dict(headers),
            # The event's id: faststream would draw a random uuid4 for each publish.
            correlation_id=headers.get("Nats-Msg-Id"),
            stream=self.cfg.events_stream,
            timeout=self.cfg.publish_timeout_s,
        )

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
