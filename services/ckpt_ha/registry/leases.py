"""Leases in Redis: the one way a replica takes, keeps and gives up the right to do something
alone, and the owner of the loop leases ``<p>:lease:<name>``.

A lease is a key set with ``SET NX PX`` to its holder's id: taken only when nobody holds it,
kept by renewing its expiry (only by its holder), given up by deleting it (only by its holder).
A holder that dies without giving it up loses it when it expires, so another replica takes over
within one lifetime. Renewal and release compare the holder and act in one Lua script: a holder
whose lease expired and was taken by another never extends or deletes the other's.

Two uses share these mechanics:

* ``<p>:lease:<name>``: which replica runs a service's periodic loop (the writer-watcher's scan
  of one storage root, the integrity-checker's scrub and reconcile, the retention-janitor's
  rounds). `RedisLeases` owns these keys; `ckpt_ha.runtime.leader` runs a loop under one.
* ``<p>:coord:lease:<job>:<attempt>``: who decides one failure (owned and formatted by
  `ckpt_ha.registry.restores`, which takes it with `acquire`).

Leases are transient: a rebuild neither replays nor needs them.
"""

from __future__ import annotations

import redis.asyncio as aioredis

KEY_SPACE = "lease:"
"""Every loop lease starts with ``<prefix>:`` and this."""

_RENEW_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def key(prefix: str, name: str) -> str:
    """The key of the loop lease ``name`` (a ``*`` name makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}{name}"


def _ms(ttl_s: float) -> int:
    return max(1, int(ttl_s * 1000))


async def acquire(client: aioredis.Redis, lease_key: str, owner: str, ttl_s: float) -> bool:
    """Take the lease at ``lease_key`` for ``owner`` if nobody holds it (its holder included:
    a second delivery to the same holder does not get it either)."""
    return bool(await client.set(lease_key, owner, nx=True, px=_ms(ttl_s)))


class RedisLeases:
    """The loop leases of one registry prefix, and the compare-and-act scripts."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self.prefix = prefix
        self._renew = client.register_script(_RENEW_LUA)
        self._release = client.register_script(_RELEASE_LUA)

    async def take(self, name: str, owner: str, ttl_s: float) -> bool:
        """Hold the lease ``name`` for another ``ttl_s``: taken when free, renewed when
        ``owner`` holds it already; False while another holder does."""
        k = key(self.prefix, name)
        if await self._renew(keys=[k], args=[owner, _ms(ttl_s)]):
            return True
        return await acquire(self._r, k, owner, ttl_s)

    async def release(self, name: str, owner: str) -> bool:
        """Give the lease up, if ``owner`` still holds it (another replica then takes it at its
        next try instead of waiting for the expiry)."""
        return bool(await self._release(keys=[key(self.prefix, name)], args=[owner]))

    async def holder(self, name: str) -> str | None:
        """Who holds the lease now; None: nobody."""
        raw = await self._r.get(key(self.prefix, name))
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)
