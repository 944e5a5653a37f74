"""Dead-lettered messages and why: the newest of the dead-letter stream, read from JetStream's
headers (the original bytes stay in the stream)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    consumer: str | None
    code: str | None
    deliveries: str | None
    subject: str | None
    error: str | None
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def newest(js: JetStreamContext, stream: str, limit: int) -> list[DeadLetter]:
    """The last ``limit`` dead letters, oldest first; none when the stream does not exist."""
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return []
    out: list[DeadLetter] = []
    first = max(info.state.first_seq, info.state.last_seq - limit + 1)
    for seq in range(first, info.state.last_seq + 1) if info.state.messages else ():
        try:
            msg = await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            continue
        h = msg.headers or {}
        out.append(
            DeadLetter(
                seq=seq,
                consumer=h.get("Ckpt-Consumer"),
                code=h.get("Ckpt-Error-Code"),
                deliveries=h.get("Ckpt-Delivery-Count"),
                subject=h.get("Ckpt-Original-Subject"),
                error=h.get("Ckpt-Error"),
                bytes=len(msg.data or b""),
            )
        )
    return out
