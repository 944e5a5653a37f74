"""The one place a Redis client is built, for every owner of a key space (registry, restore
state, pins, the watcher's state) and every process that holds several of them on one
connection pool. Client options (decoding, and any timeout or retry policy) are set here once,
so no owner or composition root can drift from the others."""

from __future__ import annotations

import redis.asyncio as aioredis


def connect(url: str) -> aioredis.Redis:
    """A client for ``url`` (``redis://`` / ``rediss://`` / ``unix://``) returning ``str``."""
    return aioredis.Redis.from_url(url, decode_responses=True)
