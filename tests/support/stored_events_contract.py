"""What every `StoredEvents` (the real `Bus`, the in-memory fake) answers alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.restore_coordinator.ports import StoredEvents

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
Add = Callable[[Envelope[EventData]], Awaitable[None]]


def commit(job: str, step: int) -> Envelope[EventData]:
    data = CheckpointCommittedV1(
        job_id=job, checkpoint_id=f"{job}-{step}", uri=f"file:///nowhere/{job}/step-{step}",
        run_id="run-1", step=step, format=CheckpointFormat.NATIVE, shard_count=1, total_bytes=1,
    )  # fmt: skip
    return build(data, source="test", time=T0 + timedelta(seconds=step), key=f"{job}-{step}")


async def check_stored_events(reader: StoredEvents, add: Add) -> None:
    """None before any; then the newest event of the type for that job only."""
    kind = CheckpointCommittedV1.EVENT_TYPE
    assert await reader.last_event(kind, "job-a") is None
    for event in (commit("job-a", 100), commit("job-a", 200), commit("job-b", 300)):
        await add(event)
    newest = await reader.last_event(kind, "job-a")
    assert newest is not None
    assert (newest.event_type, newest.data.__dict__["checkpoint_id"]) == (kind, "job-a-200")
    assert newest.time == T0 + timedelta(seconds=200)
    assert await reader.last_event("checkpoint.verified", "job-a") is None
    assert await reader.last_event(kind, "job-c") is None
