"""Test helpers for talking to the real broker: raw publishes, dead-letter reads, waits."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from nats.aio.msg import Msg

from ckpt_ha.contracts import framing, signing
from ckpt_ha.contracts.subjects import parse_event_subject
from ckpt_ha.credentials import nats_inbox_prefix

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


SIGNING_KEY = secrets.token_hex(32)
"""This test session's master key for job signatures (the `settings` fixture's)."""


def job_signed(subject: str, data: bytes, headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` plus the signature the subject's job would make (`ckpt_ha.contracts.signing`)
    when the subject is an event subject; unchanged otherwise."""
    out = dict(headers or {})
    address = parse_event_subject(subject.split(".", 1)[0], subject)
    if address is not None:
        out[framing.SIGNATURE] = framing.signature(job_key(address.job_id), subject, data)
    return out


def job_key(job_id: str) -> bytes:
    """The key the runner would hand ``job_id``'s training process (``CKPT_HA_JOB_KEY``)."""
    return signing.job_key(bytes.fromhex(SIGNING_KEY), job_id)


async def publish_raw(
    url: str,
    subject: str,
    data: bytes,
    headers: dict[str, str] | None = None,
    *,
    sign: bool = True,
) -> None:
    """Publish bytes as they are; signed as their job would sign them unless ``sign=False``."""
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(
            subject, data, headers=job_signed(subject, data, headers) if sign else headers
        )
    finally:
        await nc.close()


async def stream_messages(url: str, stream: str) -> list[Msg]:
    """Every message currently stored in ``stream``, in order (reads by sequence)."""
    nc = await nats.connect(url, inbox_prefix=nats_inbox_prefix(url, None))
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
