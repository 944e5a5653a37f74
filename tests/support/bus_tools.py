"""Test helpers for talking to the real broker: raw publishes, dead-letter reads, waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from nats.aio.msg import Msg

T = TypeVar("T")


async def wait_for(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 10.0, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def publish_raw(
    url: str, subject: str, data: bytes, headers: dict[str, str] | None = None
) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(subject, data, headers=headers)
    finally:
        await nc.close()


async def stream_messages(url: str, stream: str) -> list[Msg]:
    """Every message currently stored in ``stream``, in order (reads by sequence)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return []
        out: list[Msg] = []
        if info.state.messages == 0:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                raw = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            out.append(
                Msg(nc, subject=raw.subject or "", data=raw.data or b"", headers=raw.headers)
            )
        return out
    finally:
        await nc.close()
