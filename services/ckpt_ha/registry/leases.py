"""Leases in Redis: the one way a replica takes, keeps and gives up the right to do something
alone, and the owner of the loop leases ``<p>:lease:<name>``.

A lease names its holder and runs out at a time: taken only when nobody holds it (or it ran
out), kept by renewing it (only by its holder), given up by its holder. A holder that dies
without giving it up loses it when it runs out, so another replica takes over within one
lifetime. Two forms share these rules:

* ``<p>:lease:<name>``: which replica runs a service's periodic loop (the writer-watcher's scan
  of one storage root, the integrity-checker's scrub and reconcile, the retention-janitor's
  rounds). `RedisLeases` owns these keys; `ckpt_ha.runtime.leader` runs a loop under one. Each
  is a hash (``holder``, ``until`` in the server's milliseconds) changed only by Lua scripts
  that compare the holder and the server's clock in one step. A hash, not a string with an
  expiry: the services holding loop leases mostly only read the registry, and on Redis 6 (no
  read-only key patterns) a granted command reaches every key a user may read, so they are
  granted no command that writes a string or sets an expiry (a registry record is a string, its
  indexes are sets: hash commands cannot touch them). A loop lease key stays (two fields per
  loop) after its holder gives it up.
* ``<p>:coord:lease:<job>:<attempt>``: who decides one failure, a string set with
  ``SET NX PX`` (`acquire`) by the restore-coordinator, which writes its own key space anyway
  (owned and formatted by `ckpt_ha.restore_coordinator.store`).

Leases are transient: a rebuild neither replays nor needs them.
"""

from __future__ import annotations

import redis.asyncio as aioredis

KEY_SPACE = "lease:"
"""Every loop lease starts with ``<prefix>:`` and this."""

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_TAKE_LUA = (
    _NOW_MS
    + """
local holder = redis.call('HGET', KEYS[1], 'holder')
local untl = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if holder and holder ~= ARGV[1] and untl > now then
  return 0
end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'until', now + tonumber(ARGV[2]))
return 1
"""
)

_RELEASE_LUA = (
    _NOW_MS
    + """
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'until', now)
  return 1
end
return 0
"""
)

_HOLDER_LUA = (
    _NOW_MS
    + """
local holder = redis.call('HGET', KEYS[1], 'holder')
local untl = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if holder and untl > now then
  return holder
end
return false
"""
)


def key(prefix: str, name: str) -> str:
    """The key of the loop lease ``name`` (a ``*`` name makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}{name}"


def _ms(ttl_s: float) -> int:
    return max(1, int(ttl_s * 1000))


async def acquire(client: aioredis.Redis, lease_key: str, owner: str, ttl_s: float) -> bool:
    """Take the lease at ``lease_key`` for ``owner`` if nobody holds it (its holder included:
    a second delivery to the same holder does not get it either)."""
    return bool(await client.set(lease_key, owner, nx=True, px=_ms(ttl_s)))


def ms(ttl_s: float) -> int:
    """A lease's lifetime as `acquire` sets it (``PX``), for a caller's script that takes many
    leases at once in the same way."""
    return _ms(ttl_s)


class RedisLeases:
    """The loop leases of one registry prefix."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.prefix = prefix
        self._take = client.register_script(_TAKE_LUA)
        self._release = client.register_script(_RELEASE_LUA)
        self._holder = client.register_script(_HOLDER_LUA)

    async def take(self, name: str, owner: str, ttl_s: float) -> bool:
        """Hold the lease ``name`` for another ``ttl_s``: taken when free or run out, renewed
        when ``owner`` holds it already; False while another holder does."""
        return bool(await self._take(keys=[key(self.prefix, name)], args=[owner, _ms(ttl_s)]))

    async def release(self, name: str, owner: str) -> bool:
        """Give the lease up (it runs out now), if ``owner`` still holds it: another replica
        takes it at its next try instead of waiting for it to run out."""
        return bool(await self._release(keys=[key(self.prefix, name)], args=[owner]))

    async def holder(self, name: str) -> str | None:
        """Who holds the lease now; None: nobody (never taken, given up, or run out)."""
        found = await self._holder(keys=[key(self.prefix, name)], args=[])
        if found is None:
            return None
        return found.decode() if isinstance(found, bytes) else str(found)
