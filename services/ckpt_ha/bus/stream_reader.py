"""Read events back from the streams in order (registry rebuild, drills, audits).

`iter_events` reads one stream in stream order; `last_event` reads a job's newest event of a
type. `iter_history` reads what ckpt-ha recorded on a subject filter: the event stream and,
where the filter reaches telemetry, the progress stream (what its limits kept), merged by the
events' own time (each stream is in time order already), so a reader sees a job's reports
between its events as they happened.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from ckpt_ha.bus.admission import admit
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventCatalog, EventData
from ckpt_ha.contracts.errors import ContractError
from ckpt_ha.contracts.subjects import job_event_filter, telemetry_filters

Item = Envelope[EventData] | ContractError

BATCH = 256
"""Messages one pull brings: what the reader holds at most, whatever the stream's length."""

log = logging.getLogger("ckpt_ha.bus.stream_reader")


async def last_event(
    js: JetStreamContext, cfg: BusConfig, catalog: EventCatalog, event_type: str, job_id: str
) -> Envelope[EventData] | None:
    """The newest stored event of ``event_type`` (any version) about ``job_id`` in the event
    stream (one ``STREAM.MSG.GET``), admitted as a consumer admits it (`admit`). None when
    there is none, and when it is refused (forged, malformed: logged). A stream that cannot be
    read raises (a NATS error, a timeout): each caller says what it does then."""
    subject = job_event_filter(cfg.prefix, event_type, job_id)
    try:
        msg = await js.get_last_msg(cfg.events_stream, subject)
    except NotFoundError:
        return None
    try:
        return admit(cfg, catalog, msg.data or b"", msg.subject or "", msg.headers, msg.seq)
    except ContractError as exc:
        log.warning("the last %s of %s in the stream is refused: %s", event_type, job_id, exc)
        return None


async def iter_events(
    cfg: BusConfig,
    catalog: EventCatalog,
    subject_filter: str,
    *,
    idle_timeout: float = 5.0,
    stream: str | None = None,
    batch: int = BATCH,
) -> AsyncGenerator[Item, None]:
    """Every message on ``subject_filter`` now in ``stream`` (the event stream unless given),
    in order: the event, or why the same `admit` as the live consumers refused it.

    Pulled ``batch`` at a time by an ephemeral consumer that acknowledges nothing, so a reader
    of the whole stream holds one batch, not the stream (a pushed subscription queues what the
    server sends faster than it is read). Ordered: a delivery that skips one (a pull whose
    answer was lost) starts a new consumer after the last message read."""
    name = stream or cfg.events_stream
    nc = await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )
    try:
        js = nc.jetstream()
        info = await js.stream_info(name)
        if info.state.messages == 0:
            return
        crossed = (intersect(subject_filter, s) for s in info.config.subjects or [])
        within = {f for f in crossed if f is not None}
        # A consumer's filter must lie within one of the stream's subjects (and a server before
        # 2.10 takes one filter): a filter across several (``<prefix>.ev.>`` on the event
        # stream, which lists its subjects) reads the whole stream and matches here.
        server_filter = within.pop() if len(within) == 1 else ""
        after = 0  # stream sequence of the last message read
        while True:
            consumer = await js.add_consumer(
                name,
                ConsumerConfig(
                    filter_subject=server_filter or None,
                    ack_policy=AckPolicy.NONE,
                    deliver_policy=(
                        DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL
                    ),
                    opt_start_seq=after + 1 if after else None,
                    mem_storage=True,
                    inactive_threshold=max(30.0, 4 * idle_timeout),
                ),
            )
            durable = consumer.name
            assert durable is not None
            sub = await js.pull_subscribe_bind(durable, stream=name)
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
                        if server_filter == subject_filter or matches(msg.subject, subject_filter):
                            yield _admitted(cfg, catalog, msg)
                        if meta.num_pending == 0:
                            return
                    if skipped:
                        break
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
                with contextlib.suppress(Exception):
                    await js.delete_consumer(name, durable)
    finally:
        await nc.close()


def _admitted(cfg: BusConfig, catalog: EventCatalog, msg: Msg) -> Item:
    try:
        seq = msg.metadata.sequence.stream
        return admit(cfg, catalog, msg.data, msg.subject, msg.headers, seq)
    except ContractError as exc:
        return exc


def intersect(a: str, b: str) -> str | None:
    """The subjects two NATS subject filters both match, as one filter; None: none."""
    ta, tb = a.split("."), b.split(".")
    out: list[str] = []
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x is None or y is None:
            return None  # one is longer, and the shorter has no ``>`` to cover the rest
        if x == ">" or y == ">":
            rest = tb[i:] if x == ">" else ta[i:]
            return ".".join(out + rest)
        if x != y and "*" not in (x, y):
            return None
        out.append(y if x == "*" else x)
    return ".".join(out)


def overlaps(a: str, b: str) -> bool:
    """Whether two NATS subject filters match a subject in common."""
    return intersect(a, b) is not None


def matches(subject: str, subject_filter: str) -> bool:
    """Whether the literal ``subject`` is one ``subject_filter`` matches."""
    return intersect(subject, subject_filter) == subject


async def iter_history(
    cfg: BusConfig,
    catalog: EventCatalog,
    subject_filter: str,
    *,
    idle_timeout: float = 5.0,
) -> AsyncGenerator[Item, None]:
    """The events on ``subject_filter`` from the event stream and, when the filter reaches
    telemetry, the progress stream, merged by time (an event before a report of the same
    instant). What the progress stream's limits dropped is not there."""
    events = iter_events(cfg, catalog, subject_filter, idle_timeout=idle_timeout)
    if not cfg.progress_stream or not any(
        overlaps(subject_filter, f) for f in telemetry_filters(cfg.prefix)
    ):
        async with aclosing(events):
            async for item in events:
                yield item
        return
    reports = iter_events(
        cfg, catalog, subject_filter, idle_timeout=idle_timeout, stream=cfg.progress_stream
    )
    async with aclosing(events), aclosing(reports):
        heads: list[Item | None] = [await anext(events, None), await anext(reports, None)]
        sources = (events, reports)
        while heads[0] is not None or heads[1] is not None:
            pick = 0 if _before(heads[0], heads[1]) else 1
            head = heads[pick]
            assert head is not None
            yield head
            heads[pick] = await anext(sources[pick], None)


def _before(a: Item | None, b: Item | None) -> bool:
    """Whether ``a`` goes first: a refused message at once (it has no time), else the earlier."""
    if a is None or b is None:
        return b is None
    if isinstance(a, ContractError) or isinstance(b, ContractError):
        return isinstance(a, ContractError) or not isinstance(b, ContractError)
    return a.time <= b.time


async def read_events(
    cfg: BusConfig,
    catalog: EventCatalog,
    subject_filter: str,
    *,
    idle_timeout: float = 5.0,
    on_undecodable: Callable[[str], None] | None = None,
) -> tuple[list[Envelope[EventData]], int]:
    """Every decodable event on ``subject_filter`` now recorded (`iter_history`), in order, and
    how many messages were read (refused ones, by the same `admit` as the live consumers, are
    reported by error code to ``on_undecodable``)."""
    events: list[Envelope[EventData]] = []
    read = 0
    async for item in iter_history(cfg, catalog, subject_filter, idle_timeout=idle_timeout):
        read += 1
        if isinstance(item, ContractError):
            if on_undecodable is not None:
                on_undecodable(item.code)
        else:
            events.append(item)
    return events, read
