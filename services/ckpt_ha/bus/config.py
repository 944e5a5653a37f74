"""Bus settings as plain data (no faststream import), so light processes can build them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BusConfig:
    url: str = "nats://127.0.0.1:4222"
    user: str | None = None
    password: str | None = None
    prefix: str = "ckpt"
    events_stream: str = "CKPT_EVENTS"
    dead_letter_stream: str = "CKPT_DLQ"
    duplicate_window_s: float = 120.0
    max_event_bytes: int = 256 * 1024
    replicas: int = 1
    """Replicas `ckpt_ha.bus.streams.provision` gives the streams (services check at least this)."""
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    fetch_batch: int = 64
    fetch_timeout_s: float = 1.0
    batch_linger_s: float = 0.1
    """How long a batch consumer waits to fill a batch: the latency it may add to one event."""
    graceful_timeout_s: float = 20.0
    publish_timeout_s: float = 5.0
    signing_keys: tuple[bytes, ...] = field(default=(), repr=False)
    """Master keys for job signatures (`ckpt_ha.contracts.signing`): the first signs what this
    process publishes for a job; all of them verify (the previous one during a rotation)."""
    unsigned_before_seq: int = 0
    """Events stored before this stream sequence predate signing: accepted without a signature
    (set once, when upgrading a stream written by an older release; 0 = every event signed)."""

    def backoff(self, delivered: int) -> float:
        """Nak delay after the ``delivered``-th failed delivery."""
        return self.backoff_s[min(max(delivered, 1), len(self.backoff_s)) - 1]
