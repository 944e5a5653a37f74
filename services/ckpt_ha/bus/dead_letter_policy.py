"""The dead-letter policy: how every delivery of a consumed message ends.

faststream's own ack logic is off (``AckPolicy.MANUAL``); `DeadLetters` decides instead:
success → ack; `TransientError` or an unexpected exception → nak with backoff, and on the last
allowed delivery (``max_deliver``) → dead-letter; a payload that fails validation, an unknown
type, an older version this consumer does not know, or a `PermanentError` → dead-letter at once.
A dead letter keeps the original bytes and headers and adds the error, its code, the delivery
count, the consumer and the stream sequence (`ckpt_ha.bus.letters`).

An event of a version newer than this consumer knows is parked (`ckpt_ha.bus.delivery`): nak'ed
with ``park_delay_s`` until a consumer that knows it takes it (a rolling upgrade). So JetStream's
own ``max_deliver`` is unlimited and the cap is ours: a message delivered past the cap without any
answer (a crashed or hung handler, a delivery lost in a pull) is dead-lettered before its handler
runs again; for a durable that still has a JetStream cap, its max-deliveries advisory
dead-letters what exhausted it (`DeadLetters.on_max_deliveries`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import BaseMiddleware
from faststream.message import StreamMessage
from faststream.nats import NatsBroker
from faststream.nats.message import NatsMessage
from nats.aio.msg import Msg
from pydantic import ValidationError

from ckpt_ha.bus import delivery, letters
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.deadline import keep_alive_task, within_deadline
from ckpt_ha.contracts import CATALOG, EventCatalog
from ckpt_ha.contracts.errors import ContractError, UnsupportedEventVersion
from ckpt_ha.contracts.subjects import dead_letter_subject, parse_event_subject
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.core.errors import DependencyNotReady, PermanentError
from ckpt_ha.telemetry import logs, tracing

log = logging.getLogger("ckpt_ha.bus")

ADVISORY_MAX_DELIVERIES = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"


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

    async def on_max_deliveries(self, advisory: dict[str, Any]) -> None:
        """JetStream's max-deliveries advisory for a durable that still has a cap: dead-letter
        what exhausted it without any answer from a handler (read back by its sequence)."""
        if self._broker is None:
            raise RuntimeError("DeadLetters used before bind()")
        seq = int(advisory["stream_seq"])
        consumer = str(advisory["consumer"])
        stream = str(advisory.get("stream") or self.cfg.events_stream)
        js = self._broker.connection.jetstream(timeout=self.cfg.request_timeout_s)
        stored = await js.get_msg(stream, seq)
        raw = Msg(
            self._broker.connection,
            subject=stored.subject or "",
            data=stored.data or b"",
            headers=dict(stored.headers or {}),
        )
        await self.publish(
            raw,
            code="max_deliver",
            error="max deliveries reached without an ack (handler crashed or timed out)",
            delivered=int(advisory.get("deliveries", self.cfg.max_deliver)),
            consumer=consumer,
            stream_seq=seq,
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
        # The decoder names the event's job and checkpoint (`logs.enter_scope`): every line
        # logged about it, its settling included, carries them; none leaks to the next message.
        with logs.event_scope():
            try:
                result = await within_deadline(call_next(msg), cfg.handler_deadline_s)
            except Exception as exc:  # noqa: BLE001 - every failure must end in ack, nak or dead letter
                await self.letters.settle(raw, exc, consumer)
                return None
            finally:
                heartbeat.cancel()
            await self.letters.settle(raw, None, consumer)
        return result
