"""The Redis owners of the coordinator's state (``<p>:coord:*``) and of the pins
(``<p>:pins:<job>``) against a real Redis, each test under its own prefix: the same contract
suites the in-memory fakes pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis
import redis.asyncio as aioredis

from ckpt_ha.registry.pins import Pin, RedisPins
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator import liveness
from ckpt_ha.restore_coordinator.records import DecisionRecord, Point, Started, Watch
from ckpt_ha.restore_coordinator.store import RedisRestores
from tests.support.pins_contract import PinsContract
from tests.support.restores_contract import T0, TRAJECTORY_LIMIT, RestoresContract, plan, point

pytestmark = pytest.mark.integration


class TestRedisPins(PinsContract):
    @pytest.fixture
    def pins(self, prefixed_redis: tuple[aioredis.Redis, str]) -> RedisPins:
        return RedisPins(*prefixed_redis)


class TestRedisRestores(RestoresContract):
    @pytest.fixture
    def stores(self, prefixed_redis: tuple[aioredis.Redis, str]) -> tuple[RedisRestores, RedisPins]:
        pins = RedisPins(*prefixed_redis)
        return RedisRestores(*prefixed_redis, pins=pins, trajectory_limit=TRAJECTORY_LIMIT), pins


async def _keys(r: aioredis.Redis, prefix: str) -> list[str]:
    return sorted([k async for k in r.scan_iter(match=f"{prefix}:*")])


async def test_each_owner_clears_its_own_key_space_for_a_rebuild(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    """A rebuild empties every key space it replays, each through its owner: the registry's
    clear leaves the coordinator's state and the pins, and theirs leave each other's."""
    r, prefix = prefixed_redis
    pins = RedisPins(r, prefix)
    state = RedisRestores(r, prefix, pins=pins)
    await state.record_decision(
        "job-a", 1, DecisionRecord(events=()), plan=plan("p1"),
        pins=[Pin("c-300", "restored from", "p1", 300, 2)],
    )  # fmt: skip
    await state.record_started("job-a", Started(run_id="r", attempt=2, at=T0))
    await state.record_progress("job-a", [point(1)], last=point(1))
    assert await state.lease("job-a", 1, "me", 30)
    coord = [k for k in await _keys(r, prefix) if ":coord:" in k]
    assert len(coord) == 9  # the restarts index `restarted` among them
    assert await Registry(r, prefix).clear() == 0
    assert await pins.clear() == 1
    assert await _keys(r, prefix) == coord
    assert await state.clear() == 9
    assert await _keys(r, prefix) == []


async def test_a_start_record_lives_as_long_as_its_run(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    """A job may train for months without a progress report: its start never expires while
    the run goes on; the run's end gives its attempts' starts the state's lifetime."""
    r, prefix = prefixed_redis
    state = RedisRestores(r, prefix, ttl_s=3600)
    for attempt in (1, 2):
        await state.record_started("job-a", Started(run_id="r", attempt=attempt, at=T0))
    await state.record_progress("job-a", [point(1)], last=point(1))
    assert await r.pttl(f"{prefix}:coord:started:job-a:2") == -1
    assert 0 < await r.pttl(f"{prefix}:coord:traj:job-a") <= 3600_000
    await state.end_run("job-a", 2)
    for attempt in (1, 2):
        assert 0 < await r.pttl(f"{prefix}:coord:started:job-a:{attempt}") <= 3600_000
    # A new run of the job starting at attempt 1 again keeps its start for as long as it runs.
    await state.record_started("job-a", Started(run_id="r2", attempt=1, at=T0))
    assert await r.pttl(f"{prefix}:coord:started:job-a:1") == -1


async def test_a_replay_expires_state_on_the_events_clock(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    """A rebuild replays months in seconds: what the live coordinator let expire (30 days
    without a write) is gone again, what it kept alive by writing again is kept whole, and what
    is left expires when the live key would have."""
    r, prefix = prefixed_redis
    day = 86400
    now = datetime.now(UTC)
    state = RedisRestores(r, prefix, ttl_s=30 * day, replaying=True)

    def ago(days: float) -> datetime:
        return now - timedelta(days=days)

    def p(step: int, days: float) -> Point:
        return Point(step, ago(days), 1, None, None, {})

    await state.replay_to(ago(100))
    await state.record_started("job-a", Started(run_id="r", attempt=1, at=ago(100)))
    await state.record_progress("job-a", [p(1, 100)], last=p(1, 100))  # idle for 40 days next
    await state.record_progress("job-b", [p(1, 100)])  # written again within 30 days
    await state.replay_to(ago(75))
    await state.record_progress("job-b", [p(2, 75)])
    await state.replay_to(ago(60))
    assert await r.exists(f"{prefix}:coord:traj:job-a") == 0  # expired at day -70
    await state.record_progress("job-a", [p(5, 60)])
    assert sorted(await r.hkeys(f"{prefix}:coord:traj:job-a")) == ["5"]  # afresh, as live
    assert sorted(await r.hkeys(f"{prefix}:coord:traj:job-b")) == ["1", "2"]
    await state.replay_to(ago(10))
    await state.record_progress("job-b", [p(3, 10)])
    await state.finish_replay(now)

    left = await _keys(r, prefix)
    assert left == [
        f"{prefix}:coord:started:job-a:1",
        f"{prefix}:coord:traj:job-b",
        f"{prefix}:coord:trajidx:job-b",
    ]
    assert await r.pttl(f"{prefix}:coord:started:job-a:1") == -1
    expires_in = await r.pttl(f"{prefix}:coord:traj:job-b") / 1000
    assert 20 * day - 60 < expires_in <= 20 * day


async def test_a_batch_of_progress_expires_every_key_it_writes(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    """Live, each key a batch of reports writes (the trajectory, its index, each attempt's last
    point) lives ``ttl_s`` from that write; replayed, none has an expiry until the replay ends,
    and then each expires when the live one would have."""
    r, prefix = prefixed_redis
    live = RedisRestores(r, prefix, ttl_s=3600)
    await live.record_progress_many({"job-a": [point(1), point(2, attempt=2)]})
    for name in ("traj:job-a", "trajidx:job-a", "last:job-a:1", "last:job-a:2"):
        assert 3500_000 < await r.pttl(f"{prefix}:coord:{name}") <= 3600_000, name

    day = 86400
    now = datetime.now(UTC)
    replay = RedisRestores(r, prefix, ttl_s=30 * day, replaying=True)
    await replay.replay_to(now - timedelta(days=10))
    back = Point(7, now - timedelta(days=10), 1, None, None, {})
    await replay.record_progress_many({"job-b": [back]})
    for name in ("traj:job-b", "trajidx:job-b", "last:job-b:1"):
        assert await r.pttl(f"{prefix}:coord:{name}") == -1, name
    await replay.finish_replay(now)
    for name in ("traj:job-b", "trajidx:job-b", "last:job-b:1"):
        assert 20 * day - 60 < await r.pttl(f"{prefix}:coord:{name}") / 1000 <= 20 * day, name


async def test_batches_larger_than_a_script_chunk(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    """The scripts write in chunks (Lua's unpack has a limit): a trajectory written and trimmed
    by thousands of steps at once, and the watches of more jobs than a chunk, land whole."""
    r, prefix = prefixed_redis
    state = RedisRestores(r, prefix, trajectory_limit=TRAJECTORY_LIMIT)
    await state.record_progress_many({"job-a": [point(s) for s in range(1, 2501)]})
    assert sorted(map(int, await r.hkeys(f"{prefix}:coord:traj:job-a"))) == list(
        range(2501 - TRAJECTORY_LIMIT, 2501)
    )
    assert await r.zcard(f"{prefix}:coord:trajidx:job-a") == TRAJECTORY_LIMIT
    assert await state.last("job-a", 1) == point(2500)

    jobs = [f"job-{i}" for i in range(1200)]
    watch = Watch(job_id="x", run_id="r", attempt=1, started_at=T0, seen=T0, deadline_s=30)
    await state.update_watches(
        {j: (lambda _, j=j: watch.model_copy(update={"job_id": j})) for j in jobs}
    )
    assert await r.zcard(f"{prefix}:coord:due") == 1200
    ended = watch.model_copy(update={"ended": True})
    await state.update_watches({j: (lambda _: ended) for j in jobs})
    assert await r.zcard(f"{prefix}:coord:due") == 0


async def test_a_watch_written_meanwhile_is_read_again(
    prefixed_redis: tuple[aioredis.Redis, str], redis_url: str
) -> None:
    """Compare-and-set: a batch whose watches another consumer wrote between its read and its
    write reads them again and applies its changes to what is there, including a job whose
    change left the watch as it first read it (the new watch may be one it moves)."""
    r, prefix = prefixed_redis
    state = RedisRestores(r, prefix)
    w1 = Watch(job_id="job-1", run_id="r", attempt=1, started_at=T0, seen=T0, deadline_s=30)
    w2 = w1.model_copy(update={"job_id": "job-2", "attempt": 2})
    await state.update_watches({"job-1": lambda _: w1, "job-2": lambda _: w2})
    other = redis.Redis.from_url(redis_url, decode_responses=True)
    newer = w2.model_copy(update={"attempt": 3})
    seen: list[Watch | None] = []

    def move_1(w: Watch | None) -> Watch | None:
        assert w is not None
        return w.model_copy(update={"last_step": 1})

    def alive_3(w: Watch | None) -> Watch | None:
        seen.append(w)
        if len(seen) == 1:  # another consumer starts attempt 3 between the read and the write
            other.set(f"{prefix}:coord:watch:job-2", newer.model_dump_json())
        return liveness.on_alive(w, "r", 3, T0 + timedelta(seconds=5), 7)

    try:
        written = await state.update_watches({"job-1": move_1, "job-2": alive_3})
    finally:
        other.close()
    assert seen == [w2, newer]
    assert written["job-2"] == await state.watch("job-2")
    assert (written["job-2"].attempt, written["job-2"].last_step) == (3, 7)
    assert (await state.watch("job-1")).last_step == 1
