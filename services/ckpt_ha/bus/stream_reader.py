"""Read events back from the event stream in stream order (registry rebuild, drills, audits)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventCatalog, EventData
from ckpt_ha.contracts.errors import ContractError

BATCH = 256
"""Messages one pull brings: what the reader holds at most, whatever the stream's length."""


async def iter_events(
    cfg: BusConfig,
    catalog: EventCatalog,
    subject_filter: str,
    *,
    idle_timeout: float = 5.0,
    batch: int = BATCH,
) -> AsyncGenerator[Envelope[EventData] | ContractError, None]:
    """Every message on ``subject_filter`` now in the stream, in order: the event, or why the
    same `admit` as the live consumers refused it.

    Pulled ``batch`` at a time by an ephemeral consumer that acknowledges nothing, so a reader
    of the whole stream holds one batch, not the stream (a pushed subscription queues what the
    server sends faster than it is read). Ordered: a delivery that skips one (a pull whose
    answer was lost) starts a new consumer after the last message read."""
    nc = await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )
    try:
        js = nc.jetstream()
        info = await js.stream_info(cfg.events_stream)
        if info.state.messages == 0:
            return
        after = 0  # stream sequence of the last message read
        while True:
            consumer = await js.add_consumer(
                cfg.events_stream,
                ConsumerConfig(
                    filter_subject=subject_filter,
                    ack_policy=AckPolicy.NONE,
                    deliver_policy=(
                        DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL
                    ),
                    opt_start_seq=after + 1 if after else None,
                    mem_storage=True,
                    inactive_threshold=max(30.0, 4 * idle_timeout),
                ),
            )
            name = consumer.name
            assert name is not None
            sub = await js.pull_subscribe_bind(name, stream=cfg.events_stream)
            try:
                delivered = 0
                while True:
                    try:
                        msgs = await sub.fetch(batch, timeout=idle_timeout)
                    except TimeoutError:
                        return  # nothing matches, or the stream ended
                    skipped = False
                    for msg in msgs:
                        meta = msg.metadata
                        if meta.sequence.consumer != delivered + 1:
                            skipped = True  # start again after the last message read
                            break
                        delivered += 1
                        after = meta.sequence.stream
                        try:
                            yield admit(cfg, catalog, msg.data, msg.subject, msg.headers, after)
                        except ContractError as exc:
                            yield exc
                        if meta.num_pending == 0:
                            return
                    if skipped:
                        break
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
                with contextlib.suppress(Exception):
                    await js.delete_consumer(cfg.events_stream, name)
    finally:
        await nc.close()


async def read_events(
    cfg: BusConfig,
    catalog: EventCatalog,
    subject_filter: str,
    *,
    idle_timeout: float = 5.0,
    on_undecodable: Callable[[str], None] | None = None,
) -> tuple[list[Envelope[EventData]], int]:
    """Every decodable event on ``subject_filter`` now in the stream, in order, and how many
    messages were read (refused ones, by the same `admit` as the live consumers, are reported by
    error code to ``on_undecodable``)."""
    events: list[Envelope[EventData]] = []
    read = 0
    async for item in iter_events(cfg, catalog, subject_filter, idle_timeout=idle_timeout):
        read += 1
        if isinstance(item, ContractError):
            if on_undecodable is not None:
                on_undecodable(item.code)
        else:
            events.append(item)
    return events, read
