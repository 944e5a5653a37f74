"""The one place a Redis client is built, for every owner of a key space (registry, restore
state, pins, the watcher's state) and every process that holds several of them on one
connection pool. Client options (decoding, who we log in as, TLS, and any timeout or retry
policy) are set here once, so no owner or composition root can drift from the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.maint_notifications import MaintNotificationsConfig

from ckpt_ha import credentials


@dataclass(frozen=True)
class RedisConfig:
    """Where the registry lives and who we are there (a Redis ACL user, see `registry.acl`)."""

    url: str
    user: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: str | None = None
    """PEM CA bundle the server's certificate is verified against (a ``rediss://`` URL)."""

    def __post_init__(self) -> None:
        if self.ca_file and credentials.scheme(self.url) != "rediss":
            raise credentials.PlaintextWithCa("CKPT_HA_REDIS_CA_FILE", self.url, "rediss")

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
    }
    if cfg.user is not None:
        options["username"] = cfg.user
    if cfg.password is not None:
        options["password"] = cfg.password.get_secret_value()
    if cfg.ca_file:
        options["ssl_ca_certs"] = cfg.ca_file
    return aioredis.Redis.from_url(cfg.url, **options)
