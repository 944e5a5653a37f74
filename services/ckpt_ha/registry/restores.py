"""The one owner of the restore-coordinator's memory in Redis: ``<p>:coord:*``.

The coordinator writes it (its handlers reach it through their `RestoreState` port, and every
write goes through `ckpt_ha.restore_coordinator.projection`, one event at a time); the CLI
reads it through the typed read API below (`failures`, `plan`, `verdict`, `started`). The
retention-janitor reads none of it: it keeps its own view of plans from the events
(`ckpt_ha.retention_janitor.store`). Nothing else formats these keys.

Keys (``<p>`` is the registry prefix; every read per event is a handful of O(1) commands in one
or two round trips, whatever the number of checkpoints in the registry):

* ``<p>:coord:started:<job>:<attempt>``  JSON `Started`: the attempt's policy and restore target
* ``<p>:coord:traj:<job>``               hash step → JSON progress point (pre-failure trajectory)
* ``<p>:coord:trajidx:<job>``            sorted set of the steps in it (bounded: oldest trimmed)
* ``<p>:coord:last:<job>:<attempt>``     JSON last progress point of that attempt
* ``<p>:coord:failures:<job>``           hash attempt → JSON failure (signature, side, time)
* ``<p>:coord:restarts:<job>``           sorted set plan id → time planned (restart loop)
* ``<p>:coord:storage:<job>``            sorted set → time of each infrastructure-side failure
* ``<p>:coord:excluded:<job>``           set of checkpoint ids that failed to load (never again)
* ``<p>:coord:decision:<job>:<attempt>`` JSON `DecisionRecord`: the events decided for that
  failed attempt (plan or escalation) and whether they were published; one per failure
* ``<p>:coord:lease:<job>:<attempt>``    SET NX PX: who is deciding that failure right now
  (`ckpt_ha.registry.leases.acquire`)
* ``<p>:coord:plan:<plan>``              JSON `PlanRecord` (what the plan restored, for whom)
* ``<p>:coord:obs:<plan>``               list of the resumed attempt's first progress points
* ``<p>:coord:verdict:<plan>``           ``verified`` / ``diverged`` (SET NX: one verdict)
* ``<p>:coord:watch:<job>``              JSON `Watch`: the job's latest attempt, its last sign
  of life and its heartbeat deadline (or a tombstone: it ended)
* ``<p>:coord:due``                      sorted set job → unix time its watched attempt is lost
  (only attempts with a deadline that have not ended)
* ``<p>:coord:heard``                    sorted set ``job|run|attempt`` → unix time (the
  coordinator's clock) a sign of life of that attempt was last handled: transient (not in the
  stream, not rebuilt), dropped when its watch ends

Every key but the leases and ``heard`` is a projection of the event stream (job.*, resume.*,
checkpoint.registered): ``ckpt-ha registry rebuild`` clears this key space and replays the
stream into it (`clear`, and an owner built with ``replaying=True``). A lease is transient.

Lifetimes. A start record has no expiry while its run goes on: a job may train for months
without a progress report (progress is optional), and its next ``job.failed`` needs the start
to be decided. The run's end (``job.succeeded``, or an escalation: automatic restores stop)
gives the run's start records ``ttl_s`` (`end_run`); a run whose end was never reported keeps
them (about a kilobyte per attempt). Everything else expires after ``ttl_s`` without a write to
the key: the trajectory and last points are refreshed by every progress report, a plan by each
report of its resumed attempt until the verdict, failures, restarts and storage errors only
count within the stop conditions' windows. A watch has no expiry while its attempt runs (a
silent attempt is what it is for); an ended one (a tombstone) expires after ``ttl_s``. The R15
pins a decision implies are owned by `ckpt_ha.registry.pins` (no expiry) and written in the
decision's transaction through it.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ckpt_ha.core.restore_records import (
    DecisionRecord,
    Failure,
    History,
    Pin,
    PlanInProgress,
    PlanRecord,
    Point,
    Started,
    Watch,
)
from ckpt_ha.registry import leases
from ckpt_ha.registry.client import RedisConfig, cas_digest, connect
from ckpt_ha.registry.pins import RedisPins

KEY_SPACE = "coord:"
"""Every key of this owner starts with ``<prefix>:`` and this."""


def key(prefix: str, *parts: str | int) -> str:
    """The key ``<prefix>:coord:<parts joined by ':'>`` (a ``*`` part makes a pattern)."""
    return f"{prefix}:{KEY_SPACE}" + ":".join(str(x) for x in parts)


_JSON = json.JSONEncoder(separators=(",", ":"))
"""Compact JSON, one encoder for every document written (``json.dumps`` with options builds
one per call)."""


def point_json(p: Point) -> str:
    """``asdict(p)`` as JSON, built field by field: one per progress report on the hot path,
    where ``asdict`` (a deep copy) cost more than the JSON itself."""
    doc = {
        "step": p.step,
        "at": p.at.isoformat(),
        "attempt": p.attempt,
        "data_position": p.data_position,
        "rng_fingerprint": p.rng_fingerprint,
        "metrics": dict(p.metrics),
    }
    return _JSON.encode(doc)


def point_of(raw: str | bytes) -> Point:
    doc = json.loads(raw)
    doc["at"] = datetime.fromisoformat(doc["at"])
    return Point(**doc)


def failure_json(f: Failure) -> str:
    return json.dumps({**asdict(f), "at": f.at.isoformat()}, separators=(",", ":"))


def failure_of(raw: str | bytes) -> Failure:
    doc = json.loads(raw)
    doc["at"] = datetime.fromisoformat(doc["at"])
    return Failure(**doc)


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ts(at: datetime) -> float:
    return at.timestamp()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class _ReplayExpiry:
    """Expiry on the replayed events' clock (see `RedisRestores`, ``replaying``): when each key
    the replay wrote would expire, the earliest first."""

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


_CHUNK = 500
"""Keys per command when a replay deletes or expires many at once."""

_PROGRESS_LUA = """
-- The progress of a batch of reports (RedisRestores._write_progress) as one command, one job
-- after another (a pipeline of six commands per report cost the client more than the
-- server). Formats no key: KEYS are, per job, its trajectory hash, its step index, then the
-- last-point key of each attempt it reports. ARGV[1]: seconds each key written lives (0: no
-- expiry: a replay notes it instead); ARGV[2]: the trajectory's bound; ARGV[3]: JSON, per job
-- [[last point of each attempt, in the order of its KEYS], [step, point, step, point, ...]].
-- The oldest steps past the bound go in the same call. Chunks, not one unpack of a list:
-- no limit on the batch's size.
local ttl, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local CHUNK = 1000
local k = 0
for _, job in ipairs(cjson.decode(ARGV[3])) do
  local traj, idx, lasts, steps = KEYS[k + 1], KEYS[k + 2], job[1], job[2]
  for i, doc in ipairs(lasts) do
    if ttl > 0 then
      redis.call('SET', KEYS[k + 2 + i], doc, 'EX', ttl)
    else
      redis.call('SET', KEYS[k + 2 + i], doc)
    end
  end
  k = k + 2 + #lasts
  if #steps > 0 then
    for i = 1, #steps, CHUNK do
      local j = math.min(i + CHUNK - 1, #steps)
      redis.call('HSET', traj, unpack(steps, i, j))
      local scored = {}
      for s = i, j, 2 do
        scored[#scored + 1] = steps[s]
        scored[#scored + 1] = steps[s]
      end
      redis.call('ZADD', idx, unpack(scored))
    end
    if ttl > 0 then
      redis.call('EXPIRE', traj, ttl)
      redis.call('EXPIRE', idx, ttl)
    end
    local over = redis.call('ZCARD', idx) - limit
    if over > 0 then
      local dropped = redis.call('ZPOPMIN', idx, over)
      local steps_dropped = {}
      for i = 1, #dropped, 2 do steps_dropped[#steps_dropped + 1] = dropped[i] end
      for i = 1, #steps_dropped, CHUNK do
        redis.call('HDEL', traj, unpack(steps_dropped, i, math.min(i + CHUNK - 1, #steps_dropped)))
      end
    end
  end
end
return 0
"""

_WATCHES_LUA = """
-- Compare-and-set of a batch's watches (RedisRestores.update_watches): writes only if every
-- watch is still exactly what the caller read, else returns 0 (the caller reads again and
-- retries, as a WATCH transaction would). It decides nothing: the writes are what the Python
-- rules computed. Formats no key: KEYS are the batch's watches, then the heard and the due
-- sorted sets. ARGV[1]: seconds an ended watch lives (0: no expiry: a replay notes it);
-- ARGV[2]: JSON {"expect": [SHA-1 of what each watch held, '' for none], "ended": [[i, doc]...],
-- "kept": [[i, doc]...], "unheard": [...], "undue": [...], "due": [[job, time]...]}
-- (i: the watch's place in KEYS).
local ttl, n = tonumber(ARGV[1]), #KEYS - 2
local w = cjson.decode(ARGV[2])
for i = 1, n do
  local current = redis.call('GET', KEYS[i])
  if (current and redis.sha1hex(current) or '') ~= w.expect[i] then return 0 end
end
local CHUNK = 1000
local function chunked(cmd, key, args)
  for i = 1, #args, CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
end
for _, e in ipairs(w.ended) do
  if ttl > 0 then
    redis.call('SET', KEYS[e[1]], e[2], 'EX', ttl)
  else
    redis.call('SET', KEYS[e[1]], e[2])
  end
end
for _, e in ipairs(w.kept) do redis.call('SET', KEYS[e[1]], e[2]) end
chunked('ZREM', KEYS[n + 1], w.unheard)
chunked('ZREM', KEYS[n + 2], w.undue)
local scored = {}
for _, d in ipairs(w.due) do
  scored[#scored + 1] = d[2]
  scored[#scored + 1] = d[1]
end
chunked('ZADD', KEYS[n + 2], scored)
return 1
"""


class RedisRestores:
    """Async Redis adapter for the coordinator's per-job state (see the module doc).

    ``replaying``: for a rebuild from the stream. A replay writes months of events in seconds,
    and Redis's own clock would keep every key it writes: state the live coordinator lost to
    inactivity long ago (trajectories of every job ever run) would come back. So a replaying
    owner sets no expiry while it writes; it notes when each key would expire (the replayed
    event's time plus ``ttl_s``, `replay_to` moves that clock), deletes a key as soon as the
    replay passes that time (as Redis did live: a later write starts the key afresh), and
    `finish_replay` gives every key left its expiry."""

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
        self._r = client
        self._p = prefix
        self._pins = pins if pins is not None else RedisPins(client, prefix)
        self.trajectory_limit = trajectory_limit
        self.history_limit = history_limit
        self.ttl_s = ttl_s
        self._replay = _ReplayExpiry() if replaying else None
        self._progress_script = client.register_script(_PROGRESS_LUA)
        self._watches_script = client.register_script(_WATCHES_LUA)

    @classmethod
    def from_url(cls, where: str | RedisConfig, prefix: str, **kwargs: Any) -> RedisRestores:
        return cls(connect(where), prefix, **kwargs)

    async def close(self) -> None:
        await self._r.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self._r.ping())
        except (RedisConnectionError, RedisTimeoutError, OSError):
            return False

    def _k(self, *parts: str | int) -> str:
        return key(self._p, *parts)

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
        for i in range(0, len(gone), _CHUNK):
            await self._r.delete(*gone[i : i + _CHUNK])

    async def finish_replay(self, now: datetime) -> None:
        """The replay is over at ``now``: what expired by now goes, the rest gets its expiry."""
        await self.replay_to(now)
        assert self._replay is not None
        left = self._replay.remaining()
        for i in range(0, len(left), _CHUNK):
            async with self._r.pipeline(transaction=False) as pipe:
                for k, due in left[i : i + _CHUNK]:
                    pipe.pexpireat(k, int(due * 1000))
                await pipe.execute()

    async def clear(self) -> int:
        """Delete every key of this owner, leases included (before a rebuild replays the
        stream into it; the coordinator is stopped). Returns how many."""
        found = [k async for k in self._r.scan_iter(match=key(self._p, "*"), count=1000)]
        for i in range(0, len(found), _CHUNK):
            await self._r.delete(*found[i : i + _CHUNK])
        return len(found)

    # --- job.started / job.progress ---

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

    async def started(self, job: str, attempt: int) -> Started | None:
        raw = await self._r.get(self._k("started", job, attempt))
        return Started.model_validate_json(raw) if raw else None

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
        """One `_PROGRESS_LUA` call for ``writes``: per job, the last point of each attempt
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
            args=[ttl, self.trajectory_limit, _JSON.encode(jobs)],
        )

    async def point_at(self, job: str, step: int) -> Point | None:
        raw = await self._r.hget(self._k("traj", job), str(step))
        return point_of(raw) if raw else None

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

    async def verdict(self, plan: str) -> str | None:
        value = await self._r.get(self._k("verdict", plan))
        return str(value) if value else None

    # --- failures, decisions, plans ---

    async def failure_context(
        self, job: str, attempt: int, failure: Failure, storage_key: str | None, same_window: int
    ) -> tuple[Started | None, Point | None, History, set[str], DecisionRecord | None]:
        """Record the failure (idempotent) and read everything a decision needs in one round
        trip: the attempt's start, its last progress, the job's history, its exclusions, and a
        decision already taken for this failure."""
        failures = self._k("failures", job)
        restarts, storage = self._k("restarts", job), self._k("storage", job)
        first = max(1, attempt - same_window + 1)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hset(failures, str(attempt), failure_json(failure))
            pipe.hdel(failures, str(attempt - self.history_limit))
            self._expire(pipe, failures)
            if storage_key is not None:
                pipe.zadd(storage, {storage_key: _ts(failure.at)})
                self._expire(pipe, storage)
            pipe.get(self._k("started", job, attempt))
            pipe.get(self._k("last", job, attempt))
            pipe.hmget(failures, [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(restarts, 0, -1, withscores=True)
            pipe.zrange(storage, 0, -1, withscores=True)
            pipe.smembers(self._k("excluded", job))
            pipe.get(self._k("decision", job, attempt))
            out = await pipe.execute()
        started_raw, last_raw, fails, rs, ss, excluded, decision_raw = out[-7:]
        history = History(
            restarts=[_dt(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[_dt(s) for _, s in ss],
        )
        return (
            Started.model_validate_json(started_raw) if started_raw else None,
            point_of(last_raw) if last_raw else None,
            history,
            {_str(x) for x in excluded},
            DecisionRecord.model_validate_json(decision_raw) if decision_raw else None,
        )

    async def failures(self, job: str) -> list[Failure]:
        """The job's logged failures, one per attempt (a failure heard twice is one), in
        attempt order: what ``ckpt-ha policy advise`` measures the failure rate from."""
        raws = await self._r.hgetall(self._k("failures", job))
        return sorted((failure_of(v) for v in raws.values()), key=lambda f: f.attempt)

    async def set_held(self, job: str, held: bool) -> None:
        """``<p>:coord:held:<job>``: automatic restores paused (no expiry: until unheld)."""
        k = self._k("held", job)
        if not held:
            await self._r.delete(k)
            return
        if self._replay is not None:
            self._replay.persist(k)
        await self._r.set(k, "1")

    async def held(self, job: str) -> bool:
        return await self._r.get(self._k("held", job)) is not None  # (the ACL has no EXISTS)

    async def record_storage_error(self, job: str, key: str, at: datetime) -> None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.zadd(self._k("storage", job), {key: _ts(at)})
            self._expire(pipe, self._k("storage", job))
            await pipe.execute()

    async def history(self, job: str, attempt: int, same_window: int) -> History:
        first = max(1, attempt - same_window + 1)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(self._k("failures", job), [str(a) for a in range(first, attempt + 1)])
            pipe.zrange(self._k("restarts", job), 0, -1, withscores=True)
            pipe.zrange(self._k("storage", job), 0, -1, withscores=True)
            fails, rs, ss = await pipe.execute()
        return History(
            restarts=[_dt(s) for _, s in rs],
            failures=[failure_of(f) for f in fails if f],
            storage_errors=[_dt(s) for _, s in ss],
        )

    async def exclude(self, job: str, checkpoint_id: str) -> set[str]:
        """Never restore this checkpoint of the job again; returns every exclusion so far."""
        k = self._k("excluded", job)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.sadd(k, checkpoint_id)
            self._expire(pipe, k)
            pipe.smembers(k)
            members = (await pipe.execute())[-1]
        return {_str(x) for x in members}

    async def excluded(self, job: str) -> set[str]:
        return {_str(x) for x in await self._r.smembers(self._k("excluded", job))}

    async def decision(self, job: str, attempt: int) -> DecisionRecord | None:
        raw = await self._r.get(self._k("decision", job, attempt))
        return DecisionRecord.model_validate_json(raw) if raw else None

    async def lease(self, job: str, attempt: int, owner: str, ttl_s: float) -> bool:
        """Take the right to decide this failure (two replicas, or a duplicate event)."""
        return await leases.acquire(self._r, self._k("lease", job, attempt), owner, ttl_s)

    async def release(self, job: str, attempt: int) -> None:
        await self._r.delete(self._k("lease", job, attempt))

    async def record_decision(
        self,
        job: str,
        attempt: int,
        decision: DecisionRecord,
        *,
        plan: PlanRecord | None = None,
        pins: Sequence[Pin] = (),
        planned_at: datetime | None = None,
    ) -> None:
        """Store the decision and what it implies (plan, restart, pins) in one transaction."""
        async with self._r.pipeline(transaction=True) as pipe:
            k = self._k("decision", job, attempt)
            pipe.set(k, decision.model_dump_json(), ex=self._ttl(k))
            if plan is not None:
                k = self._k("plan", plan.plan_id)
                pipe.set(k, plan.model_dump_json(), ex=self._ttl(k))
                restarts = self._k("restarts", job)
                pipe.zadd(restarts, {plan.plan_id: _ts(planned_at or plan.failed_at)})
                pipe.zremrangebyrank(restarts, 0, -self.history_limit - 1)
                self._expire(pipe, restarts)
            self._pins.stage(pipe, job, pins)
            await pipe.execute()

    async def mark_published(self, job: str, attempt: int, decision: DecisionRecord) -> None:
        done = decision.model_copy(update={"published": True})
        k = self._k("decision", job, attempt)
        await self._r.set(k, done.model_dump_json(), ex=self._ttl(k))

    async def plan(self, plan_id: str) -> PlanRecord | None:
        raw = await self._r.get(self._k("plan", plan_id))
        return PlanRecord.model_validate_json(raw) if raw else None

    async def plans_of(self, plan_ids: Sequence[str]) -> dict[str, PlanRecord]:
        ids = list(dict.fromkeys(plan_ids))
        if not ids:
            return {}
        raws = await self._r.mget([self._k("plan", i) for i in ids])
        return {i: PlanRecord.model_validate_json(r) for i, r in zip(ids, raws, strict=True) if r}

    async def verdicts_of(self, plan_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(plan_ids))
        if not ids:
            return {}
        raws = await self._r.mget([self._k("verdict", i) for i in ids])
        return {i: _str(r) for i, r in zip(ids, raws, strict=True) if r}

    # --- lost attempts (heartbeat deadlines) ---

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
        command, `_WATCHES_LUA`), retried as a whole when another consumer wrote one of their
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
                args=[ttl, _JSON.encode({"expect": [cas_digest(r) for r in raws], **writes})],
            )
            if int(written):
                return dict(zip(jobs, news, strict=True))

    def _watch_writes(
        self, changed: Iterable[tuple[str, str, Watch | None, Watch | None]]
    ) -> dict[str, list[Any]]:
        """The writes of the new watches, for `_WATCHES_LUA` (a watch by its place in the
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
                due.append((job, repr(_ts(at))))  # as redis-py sends a float
        return {"ended": ended, "kept": kept, "unheard": unheard, "undue": undue, "due": due}

    async def watch(self, job: str) -> Watch | None:
        raw = await self._r.get(self._k("watch", job))
        return Watch.model_validate_json(raw) if raw else None

    async def heard(self, attempt: str, at: datetime) -> None:
        await self._r.zadd(self._k("heard"), {attempt: _ts(at)}, gt=True)

    async def heard_many(self, attempts: Mapping[str, datetime]) -> None:
        if attempts:
            await self._r.zadd(
                self._k("heard"), {a: _ts(at) for a, at in attempts.items()}, gt=True
            )

    async def last_heard(self, attempts: Sequence[str]) -> dict[str, datetime]:
        if not attempts:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for a in attempts:
                pipe.zscore(self._k("heard"), a)
            scores = await pipe.execute()
        return {a: _dt(float(s)) for a, s in zip(attempts, scores, strict=True) if s is not None}

    async def overdue(self, now: datetime, limit: int) -> list[Watch]:
        jobs = await self._r.zrangebyscore(self._k("due"), "-inf", _ts(now), start=0, num=limit)
        if not jobs:
            return []
        raws = await self._r.mget([self._k("watch", _str(j)) for j in jobs])
        found = [Watch.model_validate_json(r) for r in raws if r]
        return [w for w in found if w.due is not None and w.due < now]

    async def plans_in_progress(self) -> list[PlanInProgress]:
        """Every stored plan without a verdict yet, and whether its resumed attempt started
        (R6: retention keeps what a restore plan or a resume in progress references)."""
        pattern = self._k("plan", "*")
        keys = [_str(k) async for k in self._r.scan_iter(match=pattern, count=500)]
        out: list[PlanInProgress] = []
        for key in sorted(keys):
            plan_id = key.rsplit(":", 1)[1]
            raw, verdict = await self._r.mget(key, self._k("verdict", plan_id))
            if not raw or verdict:
                continue
            plan = PlanRecord.model_validate_json(raw)
            started = await self.started(plan.job_id, plan.attempt)
            resuming = started is not None and started.plan_id == plan.plan_id
            out.append(PlanInProgress(plan, resuming))
        return out
