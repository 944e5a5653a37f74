"""The one place a Redis client is built, for every owner of a key space (registry, restore
state, pins, the watcher's state) and every process that holds several of them on one
connection pool. Client options (decoding, who we log in as, TLS, timeouts and the retry
policy) are set here once, so no owner or composition root can drift from the others.

Every command is bounded: a connection is opened within ``connect_timeout_s`` and a reply
awaited for ``timeout_s`` (a frozen Redis is a `redis.exceptions.TimeoutError`, which the
owners report as unavailable: transient, the event is nak'ed and retried). A connection error
(Redis restarting, a dropped connection) is retried ``retries`` times with jittered exponential
backoff on a fresh connection before it is reported. A timeout is not retried here: the command
may have run, and the bus's own redelivery retries the whole handler instead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.maint_notifications import MaintNotificationsConfig

from ckpt_ha import credentials

RETRY_BACKOFF_CAP_S = 2.0


@dataclass(frozen=True)
class RedisConfig:
    """Where the registry lives and who we are there (a Redis ACL user, see `registry.acl`)."""

    url: str
    user: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: str | None = None
    """PEM CA bundle the server's certificate is verified against (a ``rediss://`` URL)."""
    timeout_s: float = 5.0
    """Bound on each command's reply."""
    connect_timeout_s: float = 5.0
    """Bound on opening a connection."""
    retries: int = 3
    """Retries of a command that met a connection error, on a new connection, with backoff."""
    retry_backoff_s: float = 0.1
    """First backoff between those retries; doubles each time, jittered, capped at 2 s."""

    def __post_init__(self) -> None:
        if self.ca_file and credentials.scheme(self.url) != "rediss":
            raise credentials.PlaintextWithCa("CKPT_HA_REDIS_CA_FILE", self.url, "rediss")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.retries < 0:
            raise ValueError(
                "Redis timeouts must be positive and retries not negative, got "
                f"{self.timeout_s}, {self.connect_timeout_s} and {self.retries}"
            )

    @property
    def shown_url(self) -> str:
        """The URL for logs and messages (a password in it replaced)."""
        return credentials.redact_url(self.url)


def connect(where: str | RedisConfig) -> aioredis.Redis:
    """A client for a URL (``redis://`` / ``rediss://`` / ``unix://``) or a `RedisConfig`,
    returning ``str``."""
    cfg = where if isinstance(where, RedisConfig) else RedisConfig(where)
    # No CLIENT command on connect (SETINFO, MAINT_NOTIFICATIONS): no ACL user is granted one.
    options: dict[str, Any] = {
        "decode_responses": True,
        "driver_info": None,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
        "socket_timeout": cfg.timeout_s,
        "socket_connect_timeout": cfg.connect_timeout_s,
        "socket_keepalive": True,
        # Both are needed: `retry` says how often and how long to wait, `retry_on_error` which
        # errors the connection lets it retry.
        "retry": Retry(
            ExponentialWithJitterBackoff(cap=RETRY_BACKOFF_CAP_S, base=cfg.retry_backoff_s),
            cfg.retries,
            supported_errors=(RedisConnectionError,),
        ),
        "retry_on_error": [RedisConnectionError],
    }
    if cfg.user is not None:
        options["username"] = cfg.user
    if cfg.password is not None:
        options["password"] = cfg.password.get_secret_value()
    if cfg.ca_file:
        options["ssl_ca_certs"] = cfg.ca_file
    return aioredis.Redis.from_url(cfg.url, **options)
