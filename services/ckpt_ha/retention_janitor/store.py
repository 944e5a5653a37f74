"""The one owner of the retention-janitor's Redis key space: ``<p>:janitor:*``.

* ``<p>:janitor:resumes:<job>``  JSON `JobResumes`: the job's plans, verdicts, resumed starts
  and R15 pins as the janitor learned them from the events (`ckpt_ha.retention_janitor.resumes`);
  absent when nothing of the job's restores is left to remember

The janitor's own view, a projection of the event stream (`ckpt_ha.retention_janitor.projection`
writes it, one event at a time): it reads no key of the restore-coordinator's. ``ckpt-ha
registry rebuild`` clears it (`clear`) and replays the stream into it with the registry. The
JSON is canonical (sorted keys), so a rebuild reproduces it byte for byte whatever order the
live consumers applied commuting events in. No expiry: what no longer counts is forgotten by
the projection, with the job's next event.

A change is a compare-and-set (`_UPDATE_LUA`): read, compute, write only if the job's view is
still what was read, else read again. Two replicas, or two consumers of one replica, may apply
events of the same job at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from ckpt_ha.registry.client import RedisConfig, cas_digest, connect
from ckpt_ha.retention_janitor.resumes import JobResumes

KEY_SPACE = "janitor:"
"""Every key of this owner starts with ``<prefix>:`` and this."""

_CHUNK = 500

_UPDATE_LUA = """
-- Compare-and-set of one job's view (RedisResumes.update): writes only if the key still holds
-- what the caller read (ARGV[1]: its SHA-1, '' for none), else returns 0 and the caller reads
-- again. ARGV[2]: the new JSON ('' deletes the key).
local current = redis.call('GET', KEYS[1])
if (current and redis.sha1hex(current) or '') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1
"""


def key(prefix: str, job: str) -> str:
    """The view of a job's resumes (``*`` for the job makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}resumes:{job}"


def pattern(prefix: str) -> str:
    """Every key of this owner, as a SCAN or ACL pattern."""
    return f"{prefix}:{KEY_SPACE}*"


def encode(view: JobResumes) -> str:
    """Canonical JSON ('' for an empty view: no key)."""
    if view.empty():
        return ""
    return json.dumps(view.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def decode(raw: str | bytes | None) -> JobResumes:
    return JobResumes.model_validate_json(raw) if raw else JobResumes()


class RedisResumes:
    """Async Redis adapter of the view (see the module doc). ``keep_s``: how long a plan
    without a verdict protects its checkpoint after the last event about it (the
    coordinator's ``CKPT_HA_STATE_TTL_S``)."""

    def __init__(self, client: aioredis.Redis, prefix: str, keep_s: float) -> None:
        self._r = client
        self._p = prefix
        self.keep_s = keep_s
        self._update = client.register_script(_UPDATE_LUA)

    @classmethod
    def from_url(cls, where: str | RedisConfig, prefix: str, keep_s: float) -> RedisResumes:
        return cls(connect(where), prefix, keep_s)

    async def close(self) -> None:
        await self._r.aclose()

    async def resumes(self, job: str) -> JobResumes:
        """The job's view (empty: nothing references any of its checkpoints)."""
        return decode(await self._r.get(key(self._p, job)))

    async def update(self, job: str, change: Callable[[JobResumes], JobResumes]) -> JobResumes:
        """Apply ``change`` to the job's view (compare-and-set, retried while another writer
        changed it meanwhile); nothing is written when it changes nothing."""
        k = key(self._p, job)
        while True:
            raw: Any = await self._r.get(k)
            old = decode(raw)
            new = change(old)
            if new == old:
                return old
            if int(await self._update(keys=[k], args=[cas_digest(raw), encode(new)])):
                return new

    async def clear(self) -> int:
        """Delete every key of this owner (before a rebuild replays the stream; the janitor is
        stopped). Returns how many."""
        found = [k async for k in self._r.scan_iter(match=pattern(self._p), count=1000)]
        for i in range(0, len(found), _CHUNK):
            await self._r.delete(*found[i : i + _CHUNK])
        return len(found)
