"""Batch consumers: a fetched batch admitted, handled in stream order, each message settled.

A batch consumer (`ckpt_ha.bus.broker.Bus.batch_consumer`) gets each fetched batch at once, for
projections that gain from one round trip per batch instead of per message. Bytes that do not
decode, or a message delivered past the cap, are settled before the handler sees the batch
(`admit_batch`); every other message is settled (ack / nak / dead letter) by its own result
(`handle_batch`). A handler that raises for the whole batch gets its events again one at a time
(`isolated`), so one bad event never fails its neighbours. `BatchPipeline` overlaps the next
fetch with the batch in progress, while keeping batches strictly in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faststream.message import StreamMessage
from nats.aio.msg import Msg

from ckpt_ha.bus import delivery
from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.dead_letter_policy import DeadLetters
from ckpt_ha.bus.deadline import HandlerDeadlineExceeded, keep_alive_task, within_deadline
from ckpt_ha.contracts import Envelope, EventCatalog, EventData
from ckpt_ha.contracts.errors import ContractError
from ckpt_ha.telemetry import logs, tracing

log = logging.getLogger("ckpt_ha.bus")


def _counts(raw: Msg) -> tuple[int, int]:
    """(times delivered, stream sequence) by nats-py's own parse (`delivery.counts` read none)."""
    meta = raw.metadata
    return meta.num_delivered, meta.sequence.stream


async def raw_batch(msg: StreamMessage[Any]) -> None:
    """Batch decoder that decodes nothing: faststream would JSON-parse every body once more."""


BatchHandler = Callable[[list[Envelope[EventData]]], Awaitable[Sequence[BaseException | None]]]
"""Handles a fetched batch in stream order; returns one result per event (None = success)."""


async def isolated(
    handler: BatchHandler, events: list[Envelope[EventData]]
) -> Sequence[BaseException | None]:
    """The handler's result for each event. When the handler fails for the batch as a whole
    (one event it cannot take, or an outage), each event is handled again on its own, in
    stream order, so the one that fails is settled by its own error and never takes its
    neighbours with it (an outage then fails each, and each is nak'ed)."""
    if not events:
        return []
    try:
        with logs.event_scope(*events):  # a batch about one job logs its id
            return await handler(events)
    except Exception as exc:  # noqa: BLE001 - isolate below
        if len(events) == 1:
            return [exc]
        log.warning("batch of %s failed (%r); handling its events one by one", len(events), exc)
    results: list[BaseException | None] = []
    for event in events:
        try:
            with logs.event_scope(event):
                [result] = await handler([event])
        except Exception as exc:  # noqa: BLE001 - this event's own failure
            result = exc
        results.append(result)
    return results


@dataclasses.dataclass
class Admitted:
    """A fetched batch once admitted: its events in stream order, the messages they came from,
    and the in-progress acks that keep all of them held until they are settled."""

    events: list[Envelope[EventData]]
    raws: list[Msg]
    heartbeat: asyncio.Task[None]


class BatchPipeline:
    """Handles a consumer's batches one after another, in fetch order, on one worker task.

    faststream fetches the next batch only after the handler returns. Here its task admits the
    batch (signature, decoding: ``admit``) and hands it to this worker, so the next fetch and
    its admission overlap with the current batch's Redis round trips, while batches are still
    handled strictly in order. At most one admitted batch waits behind the one in progress.
    """

    def __init__(
        self,
        admit: Callable[[list[Msg]], Awaitable[Admitted]],
        process: Callable[[Admitted], Awaitable[None]],
    ) -> None:
        self.admit = admit
        self.process = process
        self.queue: asyncio.Queue[Admitted] = asyncio.Queue(maxsize=1)
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


RECENT_ADMISSIONS = 4096
"""Admitted events kept (`admit_recent`): a few fetched batches of every batch consumer."""
_recent: dict[tuple[object, ...], tuple[BusConfig, EventCatalog, Envelope[EventData]]] = {}


def admit_recent(cfg: BusConfig, catalog: EventCatalog, raw: Msg, seq: int) -> Envelope[EventData]:
    """`admit` of a fetched message, the event kept for the next batch consumer that fetches
    the very same one: a service's consumers overlap (the coordinator's job index takes every
    event its ``failed`` consumer takes), and each verified every signature and decoded every
    body again. `admit` depends only on what the key holds (the same settings and catalogue,
    subject, stream sequence, body and headers), so a kept event is what admitting again would
    give; the events are immutable. A refusal is not kept: it is raised again each time."""
    headers = raw.headers
    key = (
        id(cfg),
        id(catalog),
        raw.subject,
        seq,
        raw.data,
        tuple(headers.items()) if headers else (),
    )
    found = _recent.get(key)
    # The entry holds its settings and catalogue: while it is kept, no other object has their ids.
    if found is not None and found[0] is cfg and found[1] is catalog:
        return found[2]
    event = admit(cfg, catalog, raw.data, raw.subject, headers, seq)
    if len(_recent) >= RECENT_ADMISSIONS:
        # The oldest kept (another thread's loop evicting at once: one of them does).
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):
            del _recent[next(iter(_recent))]
    _recent[key] = (cfg, catalog, event)
    return event


async def admit_batch(
    raws: list[Msg], consumer: str, cfg: BusConfig, catalog: EventCatalog, letters: DeadLetters
) -> Admitted:
    """Admit a fetched batch (`admit`): what fails admission, or was delivered past the
    cap, is settled here; in-progress acks hold the rest from now until it is settled."""
    max_deliver = cfg.max_deliver
    heartbeat = keep_alive_task(raws, cfg.ack_wait_s, cfg.handler_deadline_s)
    events: list[Envelope[EventData]] = []
    decoded: list[Msg] = []
    try:
        for raw in raws:
            delivered, seq = delivery.counts(raw.reply) or _counts(raw)
            # Past the cap only when delivered more often (`past_cap` excuses parks).
            if delivered > max_deliver and await letters.past_cap(raw, consumer):
                continue
            try:
                events.append(admit_recent(cfg, catalog, raw, seq))
                decoded.append(raw)
            except ContractError as exc:
                await settle_failed(raw, exc, consumer, letters)
    except BaseException:
        heartbeat.cancel()
        raise
    return Admitted(events, decoded, heartbeat)


async def handle_batch(
    admitted: Admitted,
    handler: BatchHandler,
    consumer: str,
    cfg: BusConfig,
    letters: DeadLetters,
) -> None:
    """Handle an admitted batch, then settle each message by its own event's result."""
    results: Sequence[BaseException | None]
    try:
        results = await within_deadline(isolated(handler, admitted.events), cfg.handler_deadline_s)
    except HandlerDeadlineExceeded as exc:
        results = [exc] * len(admitted.events)  # none settled yet: every one is nak'ed
    for raw, result in zip(admitted.raws, results, strict=True):
        if result is None:
            await letters.settle(raw, None, consumer)
        else:
            await settle_failed(raw, result, consumer, letters)


async def settle_failed(
    raw: Msg, error: BaseException, consumer: str, letters: DeadLetters
) -> None:
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
        await letters.settle(raw, error, consumer)
