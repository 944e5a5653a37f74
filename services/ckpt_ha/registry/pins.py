"""The one owner of the R15 pins: ``<p>:pins:<job>``, a hash checkpoint id → JSON `Pin`.

The restore-coordinator pins the checkpoint it restores from and the previous valid one when it
plans a resume (the ``pinned`` of its ``resume.planned``), and releases them once the resumed
attempt registers a newer valid checkpoint (its ``checkpoint.registered``); both writes are made
by `ckpt_ha.restore_coordinator.projection`. The retention-janitor never removes a pinned
checkpoint; it learns the pins from the same events into its own view
(`ckpt_ha.retention_janitor.store`), never from these keys. Nothing else formats this key.
Pins never expire on their own: a pin that
timed out would let retention delete the fallback of a resume still in progress. They are a
projection of the event stream: a registry rebuild clears them (`clear`) and replays them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from ckpt_ha.core.pins import Pin
from ckpt_ha.registry.client import RedisConfig, connect

KEY_SPACE = "pins:"
"""Every key of this owner starts with ``<prefix>:`` and this."""


def key(prefix: str, job: str) -> str:
    """The hash of a job's pins (``*`` for the job makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}{job}"


def pin_json(p: Pin) -> str:
    # Fields in their order, all plain values: what ``asdict`` gives, without its deep copy
    # (a burst of plans writes two pins each).
    return _COMPACT.encode({f: getattr(p, f) for f in _PIN_FIELDS})


_COMPACT = json.JSONEncoder(separators=(",", ":"))
_PIN_FIELDS = tuple(f.name for f in fields(Pin))


def pin_of(raw: str | bytes) -> Pin:
    return Pin(**json.loads(raw))


class RedisPins:
    """Async Redis adapter for the pins (see the module doc)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._p = prefix

    @classmethod
    def from_url(cls, where: str | RedisConfig, prefix: str) -> RedisPins:
        return cls(connect(where), prefix)

    async def close(self) -> None:
        await self._r.aclose()

    def _key(self, job: str) -> str:
        return key(self._p, job)

    async def pins(self, job: str) -> list[Pin]:
        """The job's pins, in checkpoint id order."""
        raws = await self._r.hgetall(self._key(job))
        return sorted((pin_of(v) for v in raws.values()), key=lambda p: p.checkpoint_id)

    async def pin(self, job: str, pins: Sequence[Pin]) -> None:
        """Add (or replace, by checkpoint id) pins of the job."""
        if pins:
            await self._r.hset(self._key(job), mapping={p.checkpoint_id: pin_json(p) for p in pins})

    def stage(self, pipe: Pipeline, job: str, pins: Sequence[Pin]) -> None:
        """Queue `pin` on a caller's transaction, so a restore decision and the pins it implies
        are stored together (all or nothing)."""
        if pins:
            pipe.hset(self._key(job), mapping={p.checkpoint_id: pin_json(p) for p in pins})

    def for_script(self, job: str, pins: Sequence[Pin]) -> tuple[str, list[str]]:
        """What `pin` writes, for a caller's Lua script that stores a decision and its pins in
        one step: the job's pins key and its field, value pairs (HSET)."""
        return self._key(job), [x for p in pins for x in (p.checkpoint_id, pin_json(p))]

    async def unpin(self, job: str, ids: Sequence[str]) -> None:
        """Release these checkpoints of the job (unknown ids are ignored)."""
        if ids:
            await self._r.hdel(self._key(job), *ids)

    async def clear(self) -> int:
        """Delete every job's pins (before a rebuild replays the stream). Returns how many keys."""
        found = [k async for k in self._r.scan_iter(match=key(self._p, "*"), count=1000)]
        for i in range(0, len(found), 500):
            await self._r.delete(*found[i : i + 500])
        return len(found)


class ReplayedPins(RedisPins):
    """The pins while a rebuild replays them into their emptied key space: it knows the jobs it
    pinned, so the release a ``checkpoint.registered`` asks of a job never pinned (nearly all
    of them) reads nothing."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self._pinned: set[str] = set()

    async def pins(self, job: str) -> list[Pin]:
        return await super().pins(job) if job in self._pinned else []

    async def pin(self, job: str, pins: Sequence[Pin]) -> None:
        self._pinned.add(job)
        await super().pin(job, pins)

    def stage(self, pipe: Pipeline, job: str, pins: Sequence[Pin]) -> None:
        self._pinned.add(job)
        super().stage(pipe, job, pins)
