"""The Redis owner of the retention-janitor's view of resumes (``<p>:janitor:*``) against a real
Redis, each test under its own prefix: the same contract suite the in-memory fake passes
(``tests/unit/test_retention_view.py``), canonical JSON, and a rebuild's clear of its own keys
only."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from ckpt_ha.retention_janitor import store
from ckpt_ha.retention_janitor.resumes import JobResumes
from ckpt_ha.retention_janitor.store import RedisResumes
from tests.support.resume_view_contract import KEEP_S, PIN, PLAN, START, ResumeViewContract

pytestmark = pytest.mark.integration


class TestRedisResumes(ResumeViewContract):
    @pytest.fixture
    def view(self, prefixed_redis: tuple[aioredis.Redis, str]) -> RedisResumes:
        return RedisResumes(*prefixed_redis, KEEP_S)


async def test_the_stored_json_does_not_depend_on_the_order_things_were_learned(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    """A rebuild applies commuting events in another order than the live consumers did: the
    key it writes is byte for byte the same."""
    r, prefix = prefixed_redis
    view = RedisResumes(r, prefix, KEEP_S)
    one = JobResumes(plans={"p-1": PLAN}, pins={"c-200": PIN}, starts={2: START})
    other = JobResumes(starts={2: START}, pins={"c-200": PIN}, plans={"p-1": PLAN})
    await view.update("job-a", lambda v: one)
    await view.update("job-b", lambda v: other)
    assert await r.get(store.key(prefix, "job-a")) == await r.get(store.key(prefix, "job-b"))
    assert await r.ttl(store.key(prefix, "job-a")) == -1  # no expiry: the projection forgets


async def test_clear_empties_this_owners_keys_only(
    prefixed_redis: tuple[aioredis.Redis, str],
) -> None:
    r, prefix = prefixed_redis
    view = RedisResumes(r, prefix, KEEP_S)
    await view.update("job-a", lambda v: JobResumes(pins={"c-200": PIN}))
    await r.set(f"{prefix}:coord:plan:p-1", "{}")
    assert await view.clear() == 1
    assert await view.resumes("job-a") == JobResumes()
    assert await r.get(f"{prefix}:coord:plan:p-1") == "{}"
