"""What JetStream holds for one bus, read for its metrics: backlogs, stream sizes, storage."""

from __future__ import annotations

from collections.abc import Mapping

from nats.js.client import JetStreamContext

from ckpt_ha.bus.config import BusConfig


async def consumer_info(
    js: JetStreamContext, durables: Mapping[str, str]
) -> list[tuple[str, int, int, int]]:
    """(durable, num_pending, num_ack_pending, num_redelivered) of each of ``durables`` (each
    durable's stream)."""
    found: list[tuple[str, int, int, int]] = []
    for durable, stream in durables.items():
        info = await js.consumer_info(stream, durable)
        pending, acks = info.num_pending or 0, info.num_ack_pending or 0
        found.append((durable, pending, acks, info.num_redelivered or 0))
    return found


async def stream_usage(js: JetStreamContext, cfg: BusConfig) -> list[tuple[str, int, int, int]]:
    """(stream, messages, bytes, max_bytes; -1 without a limit) of the event, the
    dead-letter and the progress stream."""
    found: list[tuple[str, int, int, int]] = []
    names = (cfg.events_stream, cfg.dead_letter_stream, cfg.progress_stream)
    for stream in filter(None, names):
        info = await js.stream_info(stream)
        limit = info.config.max_bytes
        used = (info.state.messages, info.state.bytes, -1 if limit is None else limit)
        found.append((stream, *used))
    return found


async def account_storage(js: JetStreamContext) -> tuple[int, int]:
    """(file storage used, its limit; -1 or 0 without one) of the JetStream account."""
    info = await js.account_info()
    return info.storage, info.limits.max_storage
