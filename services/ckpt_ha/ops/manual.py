"""Operator events: what a person did is published as a new fact (its own id, its actor and
reason), then read back once the registrar has recorded it. An operation returns only what the
registry holds afterwards, never what it merely asked for."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar
from uuid import uuid4

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts import EventData, build
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.ops.errors import NotRecorded
from ckpt_ha.registry.redis_registry import Registry

T = TypeVar("T")

SOURCE = "ckpt-ha/cli"
RECORD_WAIT_S = 10.0
"""How long an operation waits for the registrar to record what it published."""
POLL_S = 0.05


def new_key() -> str:
    return uuid4().hex


async def publish(
    publisher: Publisher,
    datas: Sequence[EventData],
    *,
    now: datetime,
    record: CheckpointRecord | None = None,
    key: Callable[[], str] = new_key,
) -> list[str]:
    """Publish operator actions, each a new fact with its own id; return the event ids.

    An action on a checkpoint goes into that checkpoint's trace (stored by the registry)."""
    tp, ts = (record.traceparent, record.tracestate) if record is not None else (None, None)
    envelopes = [
        build(d, source=SOURCE, time=now, key=key(), traceparent=tp, tracestate=ts) for d in datas
    ]
    for envelope in envelopes:
        await publisher.publish(envelope)
    return [e.id for e in envelopes]


async def until(
    found: Callable[[], Awaitable[T | None]], *, timeout_s: float, poll_s: float = POLL_S
) -> T | None:
    """Poll ``found`` until it returns something, at most ``timeout_s``; None when it never did."""
    for attempt in range(max(1, math.ceil(timeout_s / poll_s))):
        if attempt:
            await asyncio.sleep(poll_s)
        value = await found()
        if value is not None:
            return value
    return None


async def recorded(
    registry: Registry, checkpoint_id: str, event_id: str, *, timeout_s: float = RECORD_WAIT_S
) -> CheckpointRecord:
    """The record once the registrar has projected ``event_id`` (bounded wait)."""

    async def projected() -> CheckpointRecord | None:
        record = await registry.get(checkpoint_id)
        if record is not None and any(h.event_id == event_id for h in record.history):
            return record
        return None

    record = await until(projected, timeout_s=timeout_s)
    if record is None:
        raise NotRecorded(
            "it",
            timeout_s,
            "is it running? see `ckpt-ha status` and `ckpt-ha dead-letters`",
            event_id,
        )
    return record
