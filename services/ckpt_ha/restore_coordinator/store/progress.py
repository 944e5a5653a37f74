"""The coordinator's store, its progress side: each attempt's start, the pre-failure
trajectory and last points (one `lua/progress.lua` call per batch of reports), a resumed
attempt's observed points and the plan's continuity verdict."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ckpt_ha.restore_coordinator.records import COMPACT_JSON, Point, Started, point_json, point_of
from ckpt_ha.restore_coordinator.store.base import StoreBase


class ProgressStore(StoreBase):
    """job.started / job.progress (see `ckpt_ha.restore_coordinator.store`)."""

    async def record_started(self, job: str, started: Started) -> None:
        """No expiry while the run goes on (`end_run` gives it one)."""
        k = self._k("started", job, started.attempt)
        if self._replay is not None:
            self._replay.persist(k)
        await self._r.set(k, started.model_dump_json())

    async def end_run(self, job: str, last_attempt: int) -> None:
        """The run is over at ``last_attempt``: its start records expire after ``ttl_s``."""
        async with self._r.pipeline(transaction=False) as pipe:
            for attempt in range(1, last_attempt + 1):
                self._expire(pipe, self._k("started", job, attempt))
            await pipe.execute()

    async def record_progress(
        self, job: str, points: Sequence[Point], *, last: Point | None = None
    ) -> None:
        """``points`` into the trajectory (bounded: the oldest steps go first); ``last`` as its
        attempt's last progress (for the recompute range)."""
        lasts = {last.attempt: point_json(last)} if last is not None else {}
        await self._write_progress([(job, lasts, {str(p.step): point_json(p) for p in points})])

    async def record_progress_many(self, points: Mapping[str, Sequence[Point]]) -> None:
        """`record_progress` of a batch of reports, one command for every job in it: each
        job's points in stream order, so a step reported twice keeps the later point, as does
        each attempt's last point."""
        writes: list[tuple[str, dict[int, str], dict[str, str]]] = []
        for job, pts in points.items():
            if not pts:
                continue
            lasts: dict[int, str] = {}
            steps: dict[str, str] = {}
            for p in pts:
                doc = point_json(p)
                lasts[p.attempt] = doc
                steps[str(p.step)] = doc
            writes.append((job, lasts, steps))
        await self._write_progress(writes)

    async def _write_progress(
        self, writes: Sequence[tuple[str, Mapping[int, str], Mapping[str, str]]]
    ) -> None:
        """One `lua/progress.lua` call for ``writes``: per job, the last point of each attempt
        (attempt → JSON) and the trajectory's new points (step → JSON, the later point of a
        step reported twice), the trajectory trimmed to its bound in the same call. While
        replaying, the keys are written without expiry and their expiry noted instead."""
        keys: list[str] = []
        jobs: list[list[list[str]]] = []
        for job, lasts, steps in writes:
            if not lasts and not steps:
                continue
            traj, idx = self._k("traj", job), self._k("trajidx", job)
            keys += (traj, idx)
            for attempt in lasts:
                keys.append(self._k("last", job, attempt))
            if self._replay is not None:
                for k in keys[len(keys) - len(lasts) :]:
                    self._replay.touch(k, self.ttl_s)
                if steps:
                    self._replay.touch(traj, self.ttl_s)
                    self._replay.touch(idx, self.ttl_s)
            flat = [x for pair in steps.items() for x in pair]
            jobs.append([list(lasts.values()), flat])
        if not jobs:
            return
        ttl = self.ttl_s if self._replay is None else 0
        await self._progress_script(
            keys=keys,
            args=[ttl, self.trajectory_limit, COMPACT_JSON.encode(jobs)],
        )

    async def point_at(self, job: str, step: int) -> Point | None:
        raw = await self._r.hget(self._k("traj", job), str(step))
        return point_of(raw) if raw else None

    async def points_at(self, wanted: Sequence[tuple[str, int]]) -> list[Point | None]:
        """`point_at` of many (job, step), in their order, in one script call
        (`lua/points.lua`)."""
        if not wanted:
            return []
        raws = await self._points_script(
            keys=[self._k("traj", job) for job, _ in wanted], args=[step for _, step in wanted]
        )
        return [point_of(raw) if raw else None for raw in raws]

    async def last(self, job: str, attempt: int) -> Point | None:
        raw = await self._r.get(self._k("last", job, attempt))
        return point_of(raw) if raw else None

    async def trajectory(self, job: str, steps: Iterable[int]) -> dict[int, Point]:
        """The trajectory's points at these steps, plus its highest step (so a caller knows
        where the pre-failure trajectory ends)."""
        wanted = [str(s) for s in sorted(set(steps))] or ["-1"]
        traj, idx = self._k("traj", job), self._k("trajidx", job)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(traj, wanted)
            pipe.zrevrange(idx, 0, 0, withscores=True)
            found, top = await pipe.execute()
        out = {int(s): point_of(raw) for s, raw in zip(wanted, found, strict=True) if raw}
        if top:
            last_step = int(top[0][1])
            if last_step not in out:
                raw = await self._r.hget(traj, str(last_step))
                if raw:
                    out[last_step] = point_of(raw)
        return out

    async def observe(self, plan: str, point: Point, keep: int) -> list[Point]:
        """Append one of the resumed attempt's reports; return all kept so far (arrival order).
        The plan stays while its attempt reports (its verdict is still to come)."""
        k = self._k("obs", plan)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.rpush(k, point_json(point))
            pipe.ltrim(k, 0, keep - 1)
            pipe.lrange(k, 0, -1)
            self._expire(pipe, k)
            self._expire(pipe, self._k("plan", plan))
            raws = (await pipe.execute())[2]
        return [point_of(r) for r in raws]

    async def set_verdict(self, plan: str, verdict: str) -> bool:
        """The first verdict of a plan wins; True if this call set it."""
        k = self._k("verdict", plan)
        ttl = self.ttl_s if self._replay is None else None
        first = bool(await self._r.set(k, verdict, nx=True, ex=ttl))
        if first and self._replay is not None:
            self._replay.touch(k, self.ttl_s)
        return first
