"""What a Redis ACL user may run on which keys: the declaration each service makes in its own
``access.py`` (`RedisUser`), from which `ckpt_ha.registry.acl` renders ``deploy/redis/users.acl``,
and the command groups of the shared mechanism (leases, the registry's scripts).

A user names key spaces; a key space's pattern is formatted by its one owner: the registry's
spaces by `ckpt_ha.registry.acl.key_spaces` (from `RegistryKeys`, `pins`, `leases`), a service's
own spaces by the service (`RedisUser.key_spaces`, from the module that formats its keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

CONNECT = ("ping",)
"""Health checks. (`client.connect` turns off the client's CLIENT SETINFO on connect: Redis
before 7.2 has no such subcommand to grant.)"""
LEASES = ("evalsha", "script|load", "time", "hget", "hset")
"""What taking, renewing and giving up a loop lease runs: the scripts of
`ckpt_ha.registry.leases`, on hashes only (no command that writes a string or sets an expiry,
which on Redis 6 would reach the registry records these users only read)."""

PROJECTION = (
    "get", "set", "sadd", "srem", "zadd", "zscore", "zremrangebyscore", "rpush", "hget", "hset",
)  # fmt: skip
"""What the registry's read and compare-and-set scripts run (`projection.READ_LUA`,
`projection.WRITE_LUA`)."""


def _no_key_spaces(prefix: str) -> Mapping[str, str]:
    return {}


@dataclass(frozen=True)
class RedisUser:
    user: str
    writes: tuple[str, ...]
    """Names of key spaces this user writes (and reads)."""
    reads: tuple[str, ...]
    """Names of key spaces this user only reads."""
    commands: tuple[str, ...]
    """Commands (``command|subcommand``) its code issues; everything else is refused."""
    key_spaces: Callable[[str], Mapping[str, str]] = field(default=_no_key_spaces, compare=False)
    """The key spaces this user's service owns, by name: for a prefix, each as the key pattern
    the module that formats those keys makes (a ``*`` part for any)."""
