"""The behaviour every store of the retention-janitor's view of resumes must show, written once
and run against the in-memory fake and the Redis owner
(`ckpt_ha.retention_janitor.store.RedisResumes`).

Subclass `ResumeViewContract` in a `Test*` class and give it a `view` fixture returning an empty
store whose ``keep_s`` is `KEEP_S`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from ckpt_ha.retention_janitor.resumes import JobResumes, PinSeen, PlanSeen, StartSeen

KEEP_S = 3600.0
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
PLAN = PlanSeen(event_id="e1", plan_id="p-1", attempt=2, checkpoint_id="c-300", at=T0)
PIN = PinSeen(event_id="e1", checkpoint_id="c-200", reason="fallback", plan_id="p-1",
              restored_step=300, attempt=2, planned_at=T0)  # fmt: skip
START = StartSeen(event_id="e2", plan_id="p-1", at=T0)


def full(view: JobResumes) -> JobResumes:
    return view.model_copy(
        update={"plans": {"p-1": PLAN}, "pins": {"c-200": PIN}, "starts": {2: START}}
    )


class ResumeViewContract:
    @pytest.fixture
    def view(self) -> Any:
        raise NotImplementedError("backend test classes provide the store")

    async def test_a_job_never_heard_of_has_an_empty_view(self, view: Any) -> None:
        assert await view.resumes("job-none") == JobResumes()
        assert view.keep_s == KEEP_S

    async def test_an_update_round_trips_every_field_per_job(self, view: Any) -> None:
        new = await view.update("job-a", full)
        assert new == full(JobResumes())
        assert await view.resumes("job-a") == new
        assert await view.resumes("job-b") == JobResumes()

    async def test_a_change_to_nothing_forgets_the_job(self, view: Any) -> None:
        await view.update("job-a", full)
        assert await view.update("job-a", lambda v: JobResumes()) == JobResumes()
        assert await view.resumes("job-a") == JobResumes()

    async def test_a_change_that_changes_nothing_keeps_the_view(self, view: Any) -> None:
        await view.update("job-a", full)
        assert await view.update("job-a", lambda v: v) == full(JobResumes())
        assert await view.resumes("job-a") == full(JobResumes())

    async def test_concurrent_changes_of_one_job_are_all_kept(self, view: Any) -> None:
        """Each change reads what the others wrote (none is lost to a concurrent writer)."""

        def add(n: int) -> Any:
            def change(v: JobResumes) -> JobResumes:
                plan = PLAN.model_copy(update={"plan_id": f"p-{n}"})
                return v.model_copy(update={"plans": {**v.plans, f"p-{n}": plan}})

            return change

        await asyncio.gather(*(view.update("job-a", add(n)) for n in range(20)))
        assert sorted((await view.resumes("job-a")).plans) == sorted(f"p-{n}" for n in range(20))
