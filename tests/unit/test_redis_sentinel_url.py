"""A ``redis+sentinel://`` REDIS_URL: parsed, validated, redacted, and turned into a client that
asks the sentinels for the master with the same bounds and retries as a plain Redis URL."""

from __future__ import annotations

import pytest
import redis.exceptions
from pydantic import SecretStr
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedSSLConnection,
)

from ckpt_ha import credentials
from ckpt_ha.registry.client import (
    BadSentinelUrl,
    RedisConfig,
    SentinelUrl,
    connect,
    describe,
    is_sentinel,
)
from ckpt_ha.runtime.settings import ServiceSettings

SECRET = "s3cr3t-pw"


def test_a_sentinel_url_names_its_sentinels_service_db_and_login() -> None:
    url = SentinelUrl.parse(f"redis+sentinel://reg:{SECRET}@h1:26380,[::1]:26381,h3/mymaster/2")
    assert url.sentinels == (("h1", 26380), ("::1", 26381), ("h3", 26379))
    assert (url.service, url.db, url.user, url.tls) == ("mymaster", 2, "reg", False)
    assert url.password == SecretStr(SECRET)
    assert SECRET not in repr(url)
    plain = SentinelUrl.parse("rediss+sentinel://h1:1/svc")
    assert (plain.db, plain.user, plain.password, plain.tls) == (0, None, None, True)
    assert is_sentinel("REDIS+SENTINEL://h:1/s")
    assert not is_sentinel("redis://h:6379/0")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel:///svc", "names no sentinel"),
        ("redis+sentinel://h:1", "names no service"),
        ("redis+sentinel://h:1/", "names no service"),
        ("redis+sentinel://h:port/svc", "bad sentinel address"),
        ("redis+sentinel://h:70000/svc", "bad sentinel address"),
        (f"redis+sentinel://u:{SECRET}@h:1/svc/zero", "db 'zero' is not a number"),
    ],
)
def test_a_bad_sentinel_url_is_refused_in_one_line_without_its_password(
    url: str, reason: str
) -> None:
    with pytest.raises(BadSentinelUrl, match=reason) as exc:
        RedisConfig(url)
    assert SECRET not in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_password_in_a_sentinel_url_is_never_shown() -> None:
    url = f"redis+sentinel://reg:{SECRET}@h1:1,h2:2/svc/0"
    assert credentials.redact_url(url) == "redis+sentinel://reg:***@h1:1,h2:2/svc/0"
    assert RedisConfig(url).shown_url == "redis+sentinel://reg:***@h1:1,h2:2/svc/0"
    assert SECRET not in repr(RedisConfig(url, sentinel_password=SecretStr(SECRET)))


async def test_the_sentinel_client_bounds_and_retries_as_a_plain_one() -> None:
    cfg = RedisConfig(
        f"redis+sentinel://reg:{SECRET}@h1:1,h2:2/svc/3",
        timeout_s=1.5,
        connect_timeout_s=2.5,
        retries=4,
        sentinel_user="watcher",
        sentinel_password=SecretStr("sentinel-pw"),
    )
    client = connect(cfg)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "svc"
    conn = pool.make_connection()
    assert (conn.socket_timeout, conn.socket_connect_timeout) == (1.5, 2.5)
    assert conn.retry.get_retries() == 4
    assert conn.retry_on_error == [redis.exceptions.ConnectionError]
    assert (conn.db, conn.username, conn.password) == (3, "reg", SECRET)
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"]) for s in sentinels] == ["h1", "h2"]
    kwargs = sentinels[0].connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("watcher", "sentinel-pw")
    assert kwargs["socket_timeout"] == 1.5
    # A sentinel that does not answer is passed over at once; the lookup is retried as a whole.
    assert sentinels[0].get_retry().get_retries() == 0
    await client.aclose()


async def test_the_settings_login_wins_over_the_urls_and_tls_covers_both_sides() -> None:
    cfg = RedisConfig(
        "rediss+sentinel://url-user:url-pw@h1:1/svc",
        user="registrar",
        password=SecretStr("acl-pw"),
        ca_file="/ca.pem",
    )
    client = connect(cfg)
    pool = client.connection_pool
    # TLS to the promoted master, its commands packed by hiredis (`packed_by_hiredis`).
    assert issubclass(pool.connection_class, SentinelManagedSSLConnection)
    assert pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
    assert (pool.connection_kwargs["username"], pool.connection_kwargs["password"]) == (
        "registrar",
        "acl-pw",
    )
    sentinel_kwargs = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert sentinel_kwargs["ssl_ca_certs"] == "/ca.pem"
    await client.aclose()
    with pytest.raises(credentials.PlaintextWithCa, match="CKPT_HA_REDIS_CA_FILE"):
        RedisConfig("redis+sentinel://h1:1/svc", ca_file="/ca.pem")


def test_settings_read_the_sentinels_login_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis+sentinel://h1:1,h2:2/svc")
    monkeypatch.setenv("CKPT_HA_REDIS_SENTINEL_USER", "watcher")
    monkeypatch.setenv("CKPT_HA_REDIS_SENTINEL_PASSWORD", SECRET)
    cfg = ServiceSettings().redis()
    assert (cfg.sentinel_user, cfg.sentinel_password) == ("watcher", SecretStr(SECRET))
    assert cfg.password is None


def test_no_master_found_is_one_short_line() -> None:
    exc = MasterNotFoundError("No master found for 'svc' : {Redis<host=h1,port=1>: Error 111}")
    assert describe(exc) == (
        "No master found for 'svc' (no sentinel answered, or none knows a master)"
    )
    assert describe(redis.exceptions.ConnectionError("refused")) == "refused"


@pytest.mark.parametrize("url", ["redis://h1:6379/0", "rediss://h1:6379/0", "unix:///redis.sock"])
def test_every_client_packs_its_commands_with_hiredis_into_the_same_bytes(url: str) -> None:
    """The pool's own connection class kept (TCP, TLS, a socket; a sentinel's above), its
    commands packed by hiredis: the bytes redis-py's Python packing gives."""
    client = connect(url)
    packed = client.connection_pool.connection_class
    plain = packed.__mro__[1]
    assert packed.__name__ == f"HiredisPacked{plain.__name__}"
    command = ("EVALSHA", "ab12", 2, "k:1", "k:é", 1.5, 3, b"\x00raw")
    assert b"".join(packed().pack_command(*command)) == b"".join(plain().pack_command(*command))
