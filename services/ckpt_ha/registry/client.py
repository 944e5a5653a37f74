"""The one place a Redis client is built, for every owner of a key space (registry, restore
state, pins, the watcher's state) and every process that holds several of them on one
connection pool. Client options (decoding, who we log in as, TLS, timeouts and the retry
policy) are set here once, so no owner or composition root can drift from the others.

Every command is bounded: a connection is opened within ``connect_timeout_s`` and a reply
awaited for ``timeout_s`` (a frozen Redis is a `redis.exceptions.TimeoutError`, which the
owners report as unavailable: transient, the event is nak'ed and retried). A connection error
(Redis restarting, a dropped connection) is retried ``retries`` times with jittered exponential
backoff on a fresh connection before it is reported. A timeout is not retried here: the command
may have run, and the bus's own redelivery retries the whole handler instead.

A Sentinel URL (``redis+sentinel://[user:pass@]host1:port1,host2:port2/service[/db]``,
``rediss+sentinel://`` with TLS to the sentinels and the data nodes alike) asks the sentinels
for the service's current master on every new connection: after a failover the connection
error of the dead master is retried on a fresh connection, which finds the promoted replica.
The URL's user and password (or `RedisConfig.user` / ``password``) log in to the data nodes;
the sentinels' own login, if they have one, is ``sentinel_user`` / ``sentinel_password``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.maint_notifications import MaintNotificationsConfig
from redis.utils import HIREDIS_AVAILABLE

from ckpt_ha import credentials

RETRY_BACKOFF_CAP_S = 2.0
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


class BadSentinelUrl(credentials.CredentialsError):
    """A ``redis+sentinel://`` URL that names no sentinel, no service or a bad port or db: one
    line naming the URL with its password replaced (the CLI prints it and exits 1)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__("REDIS_URL", f"{credentials.redact_url(url)}: {reason}")


@dataclass(frozen=True)
class SentinelUrl:
    """The parts of a Sentinel URL: where the sentinels listen, which service they watch."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    user: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> SentinelUrl:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in SENTINEL_SCHEMES:
            raise BadSentinelUrl(url, f"not a {' or '.join(SENTINEL_SCHEMES)}:// URL")
        rest = rest.split("?", 1)[0].split("#", 1)[0]
        netloc, _, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        user = password = None
        if at:
            name, colon, secret = userinfo.partition(":")
            user = unquote(name) or None
            password = SecretStr(unquote(secret)) if colon and secret else None
        sentinels = tuple(_host_port(url, h) for h in hosts.split(",") if h)
        if not sentinels:
            raise BadSentinelUrl(url, "names no sentinel (host:port,host:port,...)")
        service, _, db = path.strip("/").partition("/")
        if not service:
            raise BadSentinelUrl(url, "names no service (.../service_name[/db])")
        if db and not db.isdigit():
            raise BadSentinelUrl(url, f"db {db!r} is not a number")
        return cls(
            sentinels=sentinels,
            service=unquote(service),
            db=int(db or 0),
            user=user,
            password=password,
            tls=scheme.lower() == "rediss+sentinel",
        )


def _host_port(url: str, text: str) -> tuple[str, int]:
    if text.startswith("["):  # [::1]:26379
        host, _, tail = text[1:].partition("]")
        port = tail.removeprefix(":")
    else:
        host, _, port = text.partition(":")
    port = port or str(DEFAULT_SENTINEL_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadSentinelUrl(url, f"bad sentinel address {text!r} (want host:port)")
    return host, int(port)


def describe(exc: RedisError) -> str:
    """``exc`` in one short line: a Sentinel lookup that found no master otherwise lists the
    repr of every sentinel client it asked."""
    if isinstance(exc, MasterNotFoundError):
        return str(exc).split(" : ", 1)[0] + " (no sentinel answered, or none knows a master)"
    return str(exc)


def is_sentinel(url: str) -> bool:
    """Whether ``url`` reaches Redis through Sentinel."""
    return credentials.scheme(url) in SENTINEL_SCHEMES


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
    sentinel_user: str | None = None
    """Who we log in as to the sentinels of a Sentinel URL (None: the default user)."""
    sentinel_password: SecretStr | None = field(default=None, repr=False)
    """The sentinels' password (None: they ask for none), apart from the data nodes' one."""

    def __post_init__(self) -> None:
        tls = credentials.scheme(self.url) in ("rediss", "rediss+sentinel")
        if self.ca_file and not tls:
            raise credentials.PlaintextWithCa(
                "CKPT_HA_REDIS_CA_FILE", self.url, "rediss or rediss+sentinel"
            )
        if is_sentinel(self.url):
            SentinelUrl.parse(self.url)
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.retries < 0:
            raise ValueError(
                "Redis timeouts must be positive and retries not negative, got "
                f"{self.timeout_s}, {self.connect_timeout_s} and {self.retries}"
            )

    @property
    def shown_url(self) -> str:
        """The URL for logs and messages (a password in it replaced)."""
        return credentials.redact_url(self.url)

    def __repr__(self) -> str:
        # The dataclass repr would print the URL's password; the secrets are left out anyway.
        return (
            f"RedisConfig(url={self.shown_url!r}, user={self.user!r}, "
            f"ca_file={self.ca_file!r}, timeout_s={self.timeout_s}, "
            f"connect_timeout_s={self.connect_timeout_s}, retries={self.retries}, "
            f"sentinel_user={self.sentinel_user!r})"
        )


def connect(where: str | RedisConfig) -> aioredis.Redis:
    """A client for a URL (``redis://`` / ``rediss://`` / ``unix://`` / ``redis+sentinel://``
    / ``rediss+sentinel://``) or a `RedisConfig`, returning ``str``."""
    cfg = where if isinstance(where, RedisConfig) else RedisConfig(where)
    options = {**_quiet(cfg), **_retrying(cfg), "decode_responses": True}
    if is_sentinel(cfg.url):
        return _through_sentinel(cfg, options)
    if cfg.user is not None:
        options["username"] = cfg.user
    if cfg.password is not None:
        options["password"] = cfg.password.get_secret_value()
    if cfg.ca_file:
        options["ssl_ca_certs"] = cfg.ca_file
    return packed_by_hiredis(aioredis.Redis.from_url(cfg.url, **options))


def packed_by_hiredis(client: aioredis.Redis) -> aioredis.Redis:
    """``client`` with its commands packed by hiredis, as redis-py's synchronous client packs
    them when hiredis is installed (its asyncio client packs every argument in Python: a burst's
    scripts and MGETs of a thousand keys spent a sixth of a coordinator's CPU there). The same
    bytes on the wire; the pool's connection class (TCP, TLS, a socket, a sentinel's) kept."""
    if HIREDIS_AVAILABLE:
        pool = client.connection_pool
        pool.connection_class = _hiredis_packing(pool.connection_class)
    return client


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _hiredis_packing(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    """``cls`` packing its commands with hiredis (one subclass per class, made once)."""
    if cls in _PACKED.values():
        return cls
    if cls not in _PACKED:
        serializer = HiredisRespSerializer()  # type: ignore[no-untyped-call,unused-ignore]

        class HiredisPacked(cls):  # type: ignore[valid-type,misc]
            def pack_command(self, *args: Any) -> list[bytes]:
                packed: list[bytes] = serializer.pack(*args)
                return packed

        HiredisPacked.__name__ = HiredisPacked.__qualname__ = f"HiredisPacked{cls.__name__}"
        _PACKED[cls] = HiredisPacked
    return _PACKED[cls]


def _through_sentinel(cfg: RedisConfig, options: dict[str, Any]) -> aioredis.Redis:
    """The master of the URL's service, looked up on the sentinels for every new connection."""
    url = SentinelUrl.parse(cfg.url)
    user = cfg.user if cfg.user is not None else url.user
    password = cfg.password if cfg.password is not None else url.password
    # One try per sentinel per lookup (the next sentinel is asked instead); the lookup itself
    # is retried with the connection, by the master's retry policy.
    to_sentinels: dict[str, Any] = {
        **_quiet(cfg),
        "decode_responses": True,
        "retry": Retry(NoBackoff(), 0),
    }
    if cfg.sentinel_user is not None:
        to_sentinels["username"] = cfg.sentinel_user
    if cfg.sentinel_password is not None:
        to_sentinels["password"] = cfg.sentinel_password.get_secret_value()
    if user is not None:
        options["username"] = user
    if password is not None:
        options["password"] = password.get_secret_value()
    if url.tls:
        for side in (options, to_sentinels):
            side["ssl"] = True
            if cfg.ca_file:
                side["ssl_ca_certs"] = cfg.ca_file
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(url.sentinels), sentinel_kwargs=to_sentinels, db=url.db, **options
    )
    master: aioredis.Redis = sentinel.master_for(url.service)
    return packed_by_hiredis(master)


def _quiet(cfg: RedisConfig) -> dict[str, Any]:
    """Bounded sockets, and no CLIENT command on connect (SETINFO, MAINT_NOTIFICATIONS): no ACL
    user is granted one."""
    return {
        "driver_info": None,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
        "socket_timeout": cfg.timeout_s,
        "socket_connect_timeout": cfg.connect_timeout_s,
        "socket_keepalive": True,
    }


def _retrying(cfg: RedisConfig) -> dict[str, Any]:
    return {
        # Both are needed: `retry` says how often and how long to wait, `retry_on_error` which
        # errors the connection lets it retry.
        "retry": Retry(
            ExponentialWithJitterBackoff(cap=RETRY_BACKOFF_CAP_S, base=cfg.retry_backoff_s),
            cfg.retries,
            supported_errors=(RedisConnectionError,),
        ),
        "retry_on_error": [RedisConnectionError],
    }


def cas_digest(raw: str | bytes | None) -> str:
    """The digest a compare-and-set script compares a value read with: Lua's
    ``redis.sha1hex`` of it, '' for no value (every owner's scripts use ``current and
    redis.sha1hex(current) or ''``). Not a security boundary."""
    if raw is None:
        return ""
    data = raw.encode() if isinstance(raw, str) else raw
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()
