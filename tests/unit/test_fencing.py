"""Fencing of stale writers (R17): the registrar's decision, with the in-memory registry.

Once attempt N+1 of a run is planned (``resume.planned``), a commit whose identity names that run
and an attempt up to N is held as ``fenced`` and announced once as ``checkpoint.fenced``; it is
never verified, never valid, and the closure of a resume never deletes its bytes.
"""

from __future__ import annotations

from ckpt_ha.contracts.checkpoint import CheckpointFencedV1, CheckpointState
from ckpt_ha.core.records import Applied, project
from ckpt_ha.registrar.domain import follow_ups
from ckpt_ha.restore_coordinator import adapters as coordinator_adapters
from ckpt_ha.restore_coordinator.domain.pins import leftovers
from tests.support.events import T0, committed, planned, verified
from tests.support.fakes.registry import InMemoryRegistry

S = CheckpointState


async def fenced_applied(registry: InMemoryRegistry, key: str = "writer") -> Applied:
    await registry.apply(planned(attempt=2))
    return await registry.apply(committed("zombie", step=20, attempt=1, key=key))


async def test_a_fenced_commit_is_announced_once() -> None:
    registry = InMemoryRegistry()
    first = await fenced_applied(registry)
    event = committed("zombie", step=20, attempt=1, key="writer")
    [announced] = follow_ups(event, first)
    assert isinstance(announced, CheckpointFencedV1)
    assert (announced.run_id, announced.attempt, announced.fenced_by) == ("run-1", 1, 2)
    assert announced.step == 20
    assert "attempt 2 was planned" in announced.reason
    # The redelivered fencing commit says it again (same deterministic id, deduplicated);
    # the other announcement of the same commit (the watcher's) says nothing.
    again = await registry.apply(event)
    assert again.duplicate
    assert follow_ups(event, again) == [announced]
    watcher = committed("zombie", step=20, attempt=1, key="watcher")
    assert follow_ups(watcher, await registry.apply(watcher)) == []


async def test_a_new_run_of_the_same_job_and_the_planned_attempt_are_not_fenced() -> None:
    registry = InMemoryRegistry()
    await registry.apply(planned(attempt=2))
    other_run = await registry.apply(committed("other", step=20, attempt=1, run="run-2"))
    assert other_run.record is not None
    assert other_run.record.state is S.PENDING_VERIFICATION
    resumed = await registry.apply(committed("resumed", step=21, attempt=2, key="r"))
    assert resumed.record is not None
    assert resumed.record.state is S.PENDING_VERIFICATION
    assert follow_ups(committed("resumed", step=21, attempt=2, key="r"), resumed) == []


async def test_a_commit_without_an_identity_then_with_one_is_fenced() -> None:
    """The watcher may announce a plain commit first (no identity: no attempt known); the
    writer's announcement naming the stale attempt fences it."""
    registry = InMemoryRegistry()
    await registry.apply(committed("zombie", step=20, key="watcher"))
    await registry.apply(planned(attempt=2))
    applied = await registry.apply(committed("zombie", step=20, attempt=1, key="writer"))
    assert applied.record is not None
    assert applied.record.state is S.FENCED
    writer = committed("zombie", step=20, attempt=1, key="writer")
    assert [type(e) for e in follow_ups(writer, applied)] == [CheckpointFencedV1]


async def test_a_checkpoint_handled_before_the_plan_stays_as_it_is() -> None:
    registry = InMemoryRegistry()
    await registry.apply(committed("early", step=10, attempt=1, key="writer"))
    await registry.apply(planned(attempt=2))
    late = await registry.apply(committed("early", step=10, attempt=1, key="watcher"))
    assert late.record is not None
    assert late.record.state is S.PENDING_VERIFICATION
    valid = await registry.apply(verified("early", step=10))
    assert valid.record is not None
    assert valid.record.state is S.VALID


async def test_closure_never_deletes_a_fenced_checkpoint() -> None:
    """R11's closure removes the failed attempt's partial writes only: a fenced checkpoint's
    bytes stay until retention expires and deletes it with a tombstone."""
    registry = InMemoryRegistry()
    await fenced_applied(registry)
    records = await registry.by_job("job-1")
    left = leftovers(
        [coordinator_adapters.candidate(r) for r in records],
        run_id="run-1",
        attempt=1,
        failed_at=T0,
    )
    assert left == []


def test_the_fence_is_in_the_record_a_rebuild_reproduces() -> None:
    """The projection is pure: replaying the same events gives the same fenced record."""
    events = [planned(attempt=2), committed("zombie", step=20, attempt=1)]
    once = project(None, events[1], 2)[0]
    twice = project(None, events[1], 2)[0]
    assert once == twice
    assert once is not None
    assert (once.state, once.fenced_by) == (S.FENCED, 2)
