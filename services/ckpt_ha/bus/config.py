"""Bus settings as plain data (no faststream import), so light processes can build them."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from ckpt_ha import credentials
from ckpt_ha.bus.reconnect import ReconnectBackoff
from ckpt_ha.contracts.subjects import DEAD_LETTERS, is_telemetry

SHORT_RECONNECT_ATTEMPTS = 2
"""Attempts after the first that a short-lived connection makes before it gives up."""

log = logging.getLogger("ckpt_ha.bus")


async def _quiet(exc: Exception) -> None:
    log.debug("NATS connection attempt failed: %r", exc)


@dataclass(frozen=True)
class BusConfig:
    url: str = "nats://127.0.0.1:4222"
    """One server, or a cluster's servers separated by commas (`servers`)."""
    user: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: str | None = None
    """PEM CA bundle the server's certificate is verified against (a ``tls://`` URL)."""
    prefix: str = "ckpt"
    events_stream: str = "CKPT_EVENTS"
    dead_letter_stream: str = "CKPT_DLQ"
    progress_stream: str = "CKPT_PROGRESS"
    """Where ``job.progress`` and ``job.heartbeat`` go (`ckpt_ha.contracts.subjects.TELEMETRY`),
    bounded by the limits below. Empty: they stay in the event stream, unbounded (the layout of
    releases before it, for a deployment that has not run ``ckpt-ha streams provision`` yet)."""
    progress_max_age_s: float = 86400.0
    """Reports older than this leave the progress stream (0: no age limit)."""
    progress_per_job: int = 100
    """Reports kept per job and event type (newest first; -1: no such limit): the liveness
    watch needs only the newest, a continuity verdict a few dozen."""
    progress_max_bytes: int = 4 * 1024**3
    """The progress stream's size cap; the oldest reports go first (-1: no cap)."""
    duplicate_window_s: float = 120.0
    max_event_bytes: int = 256 * 1024
    replicas: int = 1
    """Replicas `ckpt_ha.bus.streams.provision` gives the streams (services check at least this):
    1 on a single server, 3 on the three-node cluster (``CKPT_HA_STREAM_REPLICAS``)."""
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    """Deliveries a message gets before it is dead-lettered, enforced by the bus
    (`ckpt_ha.bus.dead_letter_policy.DeadLetters`); JetStream's own cap is unlimited so parking
    works."""
    backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    park_delay_s: float = 300.0
    """How long an event of a version newer than the consumer knows waits before it is offered
    again (`ckpt_ha.bus.delivery`): a rolling upgrade's new consumers take it meanwhile."""
    fetch_batch: int = 64
    projection_batch: int = 256
    """Messages a batch consumer (`Bus.batch_consumer`) pulls per fetch."""
    fetch_timeout_s: float = 1.0
    batch_linger_s: float = 0.1
    """How long a batch consumer waits to fill a batch: the latency it may add to one event."""
    prompt_linger_s: float = 0.02
    """The same for a batch consumer whose events someone waits on (`Bus.batch_consumer` with
    ``prompt``: the coordinator's failures, whose plans a job's relaunch waits for). A fetch
    returns only when its batch is full or its linger is over, so a lone event waits out the
    linger; an idle consumer asks the server again every linger (about 50 requests a second)."""
    graceful_timeout_s: float = 20.0
    publish_timeout_s: float = 5.0
    """Bound on one attempt to publish (JetStream's ack included)."""
    publish_retry_s: float = 30.0
    """How long an unanswered publish is retried (`ckpt_ha.bus.publishing.publish_retrying`): long
    enough for a cluster to elect a new stream leader after a node died, or for a connection
    to come back, before the caller sees the error (and naks, or retries on its next pass)."""
    request_timeout_s: float = 5.0
    """Bound on each JetStream API call (stream and consumer info, reading a stored message)."""
    handler_deadline_s: float = 900.0
    """How long one delivery may be handled (a fetched batch, for a batch consumer). Until then
    the message is kept with in-progress acks; past it the handler is cancelled and the message
    nak'ed with backoff (dead-lettered on its last delivery), so a handler waiting on a hung
    dependency never holds its message, nor its consumer, for good. Generous: verifying a large
    checkpoint takes minutes."""
    connect_timeout_s: float = 5.0
    """Bound on one attempt to open a connection to NATS."""
    reconnect_wait_s: float = 1.0
    """Wait before the first reconnect attempt; it doubles after each failed one."""
    reconnect_wait_max_s: float = 30.0
    """Longest wait between two reconnect attempts (a long-lived process never stops trying)."""
    ping_interval_s: float = 10.0
    """A connection whose server leaves two pings unanswered is treated as lost: a frozen
    broker is noticed within three intervals (30 s), not nats-py's default six minutes."""
    signing_keys: tuple[bytes, ...] = field(default=(), repr=False)
    """Master keys for job signatures (`ckpt_ha.contracts.signing`): the first signs what this
    process publishes for a job; all of them verify (the previous one during a rotation)."""
    unsigned_before_seq: int = 0
    """Events stored before this stream sequence predate signing: accepted without a signature
    (set once, when upgrading a stream written by an older release; 0 = every event signed)."""

    def __post_init__(self) -> None:
        if self.reconnect_wait_s <= 0 or self.reconnect_wait_max_s < self.reconnect_wait_s:
            raise ValueError(
                "need 0 < reconnect_wait_s <= reconnect_wait_max_s, got "
                f"{self.reconnect_wait_s} and {self.reconnect_wait_max_s}"
            )
        if self.ca_file and credentials.scheme(self.url) != "tls":
            raise credentials.PlaintextWithCa("CKPT_HA_NATS_CA_FILE", self.url, "tls")

    def stream_of(self, subject: str) -> str:
        """The stream that stores ``subject``: the progress stream for telemetry (when there is
        one), else the event stream (or the dead-letter stream, for a dead letter)."""
        if self.progress_stream and is_telemetry(self.prefix, subject):
            return self.progress_stream
        if subject.startswith(f"{self.prefix}.{DEAD_LETTERS}."):
            return self.dead_letter_stream
        return self.events_stream

    def backoff(self, delivered: int) -> float:
        """Nak delay after the ``delivered``-th failed delivery."""
        return self.backoff_s[min(max(delivered, 1), len(self.backoff_s)) - 1]

    @property
    def retry_budget_s(self) -> float:
        """The back-off between a message's first delivery and its last (``max_deliver``): a
        handler that keeps failing it for longer has it dead-lettered."""
        return sum(self.backoff(n) for n in range(1, self.max_deliver))

    @property
    def redelivery_bound_s(self) -> float:
        """The longest a message can take from its first delivery to its last: ``max_deliver``
        deliveries, each held up to ``ack_wait_s`` by a consumer that died with it, and the
        back-off between them. An event waiting for an earlier one (`DependencyNotReady`)
        waits at least this long before it is dead-lettered (`ckpt_ha.bus.delivery.nak_delay`)."""
        return self.max_deliver * self.ack_wait_s + self.retry_budget_s

    def tls(self) -> ssl.SSLContext | None:
        """The client TLS context for a ``tls://`` URL (None: plain NATS)."""
        return credentials.nats_tls(self.url, self.ca_file)

    def connect_options(self) -> dict[str, Any]:
        """Who we are and how the connection is secured, for ``nats.connect``: every direct
        connection (runner, stream reader, CLI) takes these, as the services' brokers do."""
        return credentials.nats_options(self.url, self.user, self.password, self.ca_file)

    @property
    def inbox_prefix(self) -> str:
        """Where this connection's replies and fetched messages arrive: its user's own inbox,
        the only one its NATS user may subscribe to (`ckpt_ha.bus.permissions`)."""
        return credentials.nats_inbox_prefix(self.url, self.user)

    def connection_policy(self, *, lasting: bool) -> dict[str, Any]:
        """How long to wait and how to come back, for ``nats.connect`` and the broker.

        ``lasting`` (a service, the runner): the first connect is retried until it succeeds and
        a lost connection is retried forever with capped exponential backoff
        (`ReconnectBackoff`). Otherwise (a CLI command, a rebuild, a provisioning step): a few
        attempts, then `nats.errors.NoServersError`, which the command turns into one line.
        """
        policy: dict[str, Any] = {
            "connect_timeout": self.connect_timeout_s,
            "allow_reconnect": True,
            "reconnect_time_wait": self.reconnect_wait_s,
            "ping_interval": self.ping_interval_s,
            "max_outstanding_pings": 2,
        }
        if lasting:
            backoff = ReconnectBackoff(self.reconnect_wait_s, self.reconnect_wait_max_s)
            return policy | {"max_reconnect_attempts": -1, "reconnect_to_server_handler": backoff}
        # Each failed attempt is logged at debug only: the command's one line says it all.
        return policy | {"max_reconnect_attempts": SHORT_RECONNECT_ATTEMPTS, "error_cb": _quiet}

    @property
    def servers(self) -> list[str]:
        """Each server of ``url``, which may list several separated by commas (the nodes of a
        cluster: ``nats://n1:4222,nats://n2:4222,nats://n3:4222``); a client connects to one
        and moves to another when it is lost."""
        return credentials.nats_servers(self.url)

    @property
    def shown_url(self) -> str:
        """The URL for logs and messages (a password in it replaced)."""
        return ",".join(credentials.redact_url(part) for part in self.servers)
