"""What every part of the coordinator's store shares: the client and prefix (from the read
API it extends, `ckpt_ha.restore_coordinator.api.RestoreReader`), the limits, the one place an
expiry is set, a replay's own clock of expiries (`RedisRestores`, ``replaying``) and the Lua
scripts, shipped as package data beside this module (``lua/*.lua``).
"""

from __future__ import annotations

import heapq
from datetime import datetime
from functools import cache
from importlib.resources import files

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from ckpt_ha.registry.pins import RedisPins
from ckpt_ha.restore_coordinator.api import RestoreReader, key


@cache
def script(name: str) -> str:
    """The text of ``lua/<name>.lua`` (read once per process)."""
    return files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


class _ReplayExpiry:
    """Expiry on the replayed events' clock (see `RedisRestores`, ``replaying``): when each
    key the replay wrote would expire, the earliest first."""

    def __init__(self) -> None:
        self.now = 0.0
        """Unix time of the event being replayed (never goes back: the live clock did not)."""
        self._due: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def touch(self, key: str, ttl_s: int) -> None:
        first = key not in self._due
        self._due[key] = self.now + ttl_s
        if first:
            heapq.heappush(self._heap, (self._due[key], key))

    def persist(self, key: str) -> None:
        self._due.pop(key, None)

    def expired(self) -> list[str]:
        """Keys due by `now`, forgotten here (the caller deletes them)."""
        out: list[str] = []
        while self._heap and self._heap[0][0] <= self.now:
            at, key = heapq.heappop(self._heap)
            due = self._due.get(key)
            if due is None:
                continue  # persisted, or already expired through an older entry
            if due > at:
                heapq.heappush(self._heap, (due, key))  # written again since
                continue
            del self._due[key]
            out.append(key)
        return out

    def remaining(self) -> list[tuple[str, float]]:
        return sorted(self._due.items())


CHUNK = 500
"""Keys per command when a replay deletes or expires many at once."""


class StoreBase(RestoreReader):
    """The state the parts of `RedisRestores` share, and its expiry (see its doc)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        *,
        pins: RedisPins | None = None,
        trajectory_limit: int = 10_000,
        history_limit: int = 200,
        ttl_s: int = 30 * 24 * 3600,
        replaying: bool = False,
    ) -> None:
        super().__init__(client, prefix)
        self._pins = pins if pins is not None else RedisPins(client, prefix)
        self.trajectory_limit = trajectory_limit
        self.history_limit = history_limit
        self.ttl_s = ttl_s
        self._replay = _ReplayExpiry() if replaying else None
        self._progress_script = client.register_script(script("progress"))
        self._watches_script = client.register_script(script("watches"))
        self._attention_script = client.register_script(script("attention"))
        self._failures_script = client.register_script(script("failures"))
        self._decisions_script = client.register_script(script("decisions"))
        self._leases_script = client.register_script(script("leases"))
        self._published_script = client.register_script(script("published"))
        self._points_script = client.register_script(script("points"))

    # --- expiry (the one place a TTL is set) ---

    def _ttl(self, k: str) -> int | None:
        """The expiry to write ``k`` with (None while replaying: noted instead)."""
        if self._replay is None:
            return self.ttl_s
        self._replay.touch(k, self.ttl_s)
        return None

    def _expire(self, pipe: Pipeline, k: str) -> None:
        """``k`` expires ``ttl_s`` from now (queued on ``pipe``)."""
        if self._replay is None:
            pipe.expire(k, self.ttl_s)
        else:
            self._replay.touch(k, self.ttl_s)

    async def replay_to(self, at: datetime) -> None:
        """A replay reached an event of time ``at``: keys that had expired by then go."""
        if self._replay is None:
            raise RuntimeError("replay_to needs an owner built with replaying=True")
        self._replay.now = max(self._replay.now, at.timestamp())
        gone = self._replay.expired()
        for i in range(0, len(gone), CHUNK):
            await self._r.delete(*gone[i : i + CHUNK])

    async def finish_replay(self, now: datetime) -> None:
        """The replay is over at ``now``: what expired by now goes, the rest gets its expiry."""
        await self.replay_to(now)
        assert self._replay is not None
        left = self._replay.remaining()
        for i in range(0, len(left), CHUNK):
            async with self._r.pipeline(transaction=False) as pipe:
                for k, due in left[i : i + CHUNK]:
                    pipe.pexpireat(k, int(due * 1000))
                await pipe.execute()

    async def clear(self) -> int:
        """Delete every key of this owner, leases included (before a rebuild replays the
        stream into it; the coordinator is stopped). Returns how many."""
        found = [k async for k in self._r.scan_iter(match=key(self._p, "*"), count=1000)]
        for i in range(0, len(found), CHUNK):
            await self._r.delete(*found[i : i + CHUNK])
        return len(found)
