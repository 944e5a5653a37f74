"""The coordinator's store, its liveness side: each job's watch (compare-and-set of a batch in
one `lua/watches.lua` call), when each attempt was last heard, and the deadlines due."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ckpt_ha.registry.client import cas_digest
from ckpt_ha.restore_coordinator.records import COMPACT_JSON, Watch, from_unix, text, unix
from ckpt_ha.restore_coordinator.store.base import StoreBase


class WatchStore(StoreBase):
    """Lost attempts: heartbeat deadlines (see `ckpt_ha.restore_coordinator.store`)."""

    async def update_watch(
        self, job: str, change: Callable[[Watch | None], Watch | None]
    ) -> Watch | None:
        """Read-modify-write, compare-and-set (optimistic: retried when another consumer wrote
        the same job's watch meanwhile)."""
        return (await self.update_watches({job: change}))[job]

    async def update_watches(
        self, changes: Mapping[str, Callable[[Watch | None], Watch | None]]
    ) -> dict[str, Watch | None]:
        """`update_watch` of several jobs in two round trips (MGET, then one compare-and-set
        command, `lua/watches.lua`), retried as a whole when another consumer wrote one of their
        watches meanwhile."""
        jobs = list(changes)
        if not jobs:
            return {}
        keys = [self._k("watch", job) for job in jobs]
        while True:
            raws = await self._r.mget(keys)
            olds = [Watch.model_validate_json(r) if r else None for r in raws]
            news = [changes[job](old) for job, old in zip(jobs, olds, strict=True)]
            if all(new is None for new in news):
                return dict.fromkeys(jobs)
            writes = self._watch_writes(zip(jobs, keys, olds, news, strict=True))
            ttl = self.ttl_s if self._replay is None else 0
            written = await self._watches_script(
                keys=[*keys, self._k("heard"), self._k("due")],
                args=[
                    ttl,
                    COMPACT_JSON.encode({"expect": [cas_digest(r) for r in raws], **writes}),
                ],
            )
            if int(written):
                return dict(zip(jobs, news, strict=True))

    def _watch_writes(
        self, changed: Iterable[tuple[str, str, Watch | None, Watch | None]]
    ) -> dict[str, list[Any]]:
        """The writes of the new watches, for `lua/watches.lua` (a watch by its place in the
        batch, counted from 1 as Lua's KEYS are). While replaying, the ended watches' expiry is
        noted and the running ones' forgotten (they are kept while they run)."""
        ended: list[tuple[int, str]] = []
        kept: list[tuple[int, str]] = []
        unheard: list[str] = []
        due: list[tuple[str, str]] = []
        undue: list[str] = []
        for i, (job, k, old, new) in enumerate(changed, start=1):
            if new is None:
                continue
            # The note of when an attempt was heard goes with its watch (ended, or superseded
            # by a newer attempt).
            unheard += new.unheard(old)
            at = new.due
            if new.ended:  # a tombstone expires
                if self._replay is not None:
                    self._replay.touch(k, self.ttl_s)
                ended.append((i, new.model_dump_json()))
            else:  # watched, or never watched: kept while it runs
                if self._replay is not None:
                    self._replay.persist(k)
                kept.append((i, new.model_dump_json()))
            if at is None:
                undue.append(job)
            else:
                due.append((job, repr(unix(at))))  # as redis-py sends a float
        return {"ended": ended, "kept": kept, "unheard": unheard, "undue": undue, "due": due}

    async def heard(self, attempt: str, at: datetime) -> None:
        await self._r.zadd(self._k("heard"), {attempt: unix(at)}, gt=True)

    async def heard_many(self, attempts: Mapping[str, datetime]) -> None:
        if attempts:
            await self._r.zadd(
                self._k("heard"), {a: unix(at) for a, at in attempts.items()}, gt=True
            )

    async def last_heard(self, attempts: Sequence[str]) -> dict[str, datetime]:
        if not attempts:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for a in attempts:
                pipe.zscore(self._k("heard"), a)
            scores = await pipe.execute()
        return {
            a: from_unix(float(s)) for a, s in zip(attempts, scores, strict=True) if s is not None
        }

    async def overdue(self, now: datetime, limit: int) -> list[Watch]:
        jobs = await self._r.zrangebyscore(self._k("due"), "-inf", unix(now), start=0, num=limit)
        if not jobs:
            return []
        raws = await self._r.mget([self._k("watch", text(j)) for j in jobs])
        found = [Watch.model_validate_json(r) for r in raws if r]
        return [w for w in found if w.due is not None and w.due < now]
