"""Read events back from the event stream in stream order (registry rebuild, drills, audits)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import nats
from nats.js.api import DeliverPolicy

from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventCatalog, EventData
from ckpt_ha.contracts.errors import ContractError


async def iter_events(
    cfg: BusConfig,
    catalog: EventCatalog,
    subject_filter: str,
    *,
    idle_timeout: float = 5.0,
) -> AsyncGenerator[Envelope[EventData] | ContractError, None]:
    """Every message on ``subject_filter`` now in the stream, in order, one at a time (a reader
    of the whole stream holds one event, not the stream): the event, or why the same `admit` as
    the live consumers refused it."""
    nc = await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )
    try:
        js = nc.jetstream()
        info = await js.stream_info(cfg.events_stream)
        if info.state.messages == 0:
            return
        sub = await js.subscribe(
            subject_filter,
            stream=cfg.events_stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=idle_timeout)
                except TimeoutError:
                    break  # nothing matches, or the stream ended
                try:
                    seq = msg.metadata.sequence.stream
                    yield admit(cfg, catalog, msg.data, msg.subject, msg.headers, seq)
                except ContractError as exc:
                    yield exc
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
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
