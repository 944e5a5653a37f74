"""Bus settings as plain data (no faststream import), so light processes can build them."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from ckpt_ha import credentials


@dataclass(frozen=True)
class BusConfig:
    url: str = "nats://127.0.0.1:4222"
    user: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: str | None = None
    """PEM CA bundle the server's certificate is verified against (a ``tls://`` URL)."""
    prefix: str = "ckpt"
    events_stream: str = "CKPT_EVENTS"
    dead_letter_stream: str = "CKPT_DLQ"
    duplicate_window_s: float = 120.0
    max_event_bytes: int = 256 * 1024
    replicas: int = 1
    """Replicas `ckpt_ha.bus.streams.provision` gives the streams (services check at least this)."""
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    """Deliveries a message gets before it is dead-lettered, enforced by the bus
    (`ckpt_ha.bus.broker.DeadLetters`); JetStream's own cap is unlimited so parking works."""
    backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    park_delay_s: float = 300.0
    """How long an event of a version newer than the consumer knows waits before it is offered
    again (`ckpt_ha.bus.delivery`): a rolling upgrade's new consumers take it meanwhile."""
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

    def __post_init__(self) -> None:
        if self.ca_file and credentials.scheme(self.url) != "tls":
            raise credentials.PlaintextWithCa("CKPT_HA_NATS_CA_FILE", self.url, "tls")

    def backoff(self, delivered: int) -> float:
        """Nak delay after the ``delivered``-th failed delivery."""
        return self.backoff_s[min(max(delivered, 1), len(self.backoff_s)) - 1]

    def tls(self) -> ssl.SSLContext | None:
        """The client TLS context for a ``tls://`` URL (None: plain NATS)."""
        return credentials.nats_tls(self.url, self.ca_file)

    def connect_options(self) -> dict[str, Any]:
        """Who we are and how the connection is secured, for ``nats.connect``: every direct
        connection (runner, stream reader, CLI) takes these, as the services' brokers do."""
        return credentials.nats_options(self.url, self.user, self.password, self.ca_file)

    @property
    def shown_url(self) -> str:
        """The URL for logs and messages (a password in it replaced)."""
        return credentials.redact_url(self.url)
