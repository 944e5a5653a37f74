"""What the restore-coordinator's handlers need from the world, as small `Protocol`s.

The handlers take these, never a concrete Redis, NATS or S3 class: the composition root
(`app.build`) passes the real adapters (`Registry`, `RedisRestores`, `RedisPins`, an
`ObjectStore`, the `Bus`), the unit tests in-memory fakes that pass the same contract suites
(``tests/support/fakes``, ``tests/support/*_contract.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.pins import Pin
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator.records import (
    Attention,
    DecisionRecord,
    DecisionWrite,
    Failure,
    FailureContext,
    FailureItem,
    History,
    PlanRecord,
    Point,
    Started,
    Watch,
)
from ckpt_ha.storage.port import ObjectStore

__all__ = [
    "CheckpointReads",
    "Clock",
    "NewId",
    "ObjectStore",
    "PinStore",
    "Publisher",
    "RestoreState",
    "StoredEvents",
]

NewId = Callable[[], str]
"""A fresh unique id (who holds a lease)."""


class CheckpointReads(Protocol):
    """The registry's read side, as far as the coordinator needs it (the registrar writes)."""

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None: ...

    async def by_job(self, job_id: str) -> list[CheckpointRecord]:
        """A job's checkpoints, newest step first."""
        ...

    def by_job_pages(
        self, job_id: str, page_size: int = 64
    ) -> AsyncIterator[list[CheckpointRecord]]:
        """The same, ``page_size`` records per round trip."""
        ...

    async def newest_of_jobs(
        self, job_ids: Sequence[str], count: int
    ) -> Mapping[str, Sequence[CheckpointRecord]]:
        """The first page of `by_job_pages` (``count`` newest records, newest first) of each
        of these jobs, read at once (a burst of failures: not a round trip per job); a record
        may be parsed only when read."""
        ...


class StoredEvents(Protocol):
    """The event stream's newest event of a kind for a job (owner: `ckpt_ha.bus.broker.Bus`)."""

    async def last_event(self, event_type: str, job_id: str) -> Envelope[EventData] | None:
        """Admitted as a consumer admits it; None when there is none or it cannot be read."""
        ...


class PinStore(Protocol):
    """The R15 pins (owner: `ckpt_ha.registry.pins`). Pins are added with a decision
    (`RestoreState.record_decision`), read and released here."""

    async def pins(self, job: str) -> list[Pin]: ...

    async def unpin(self, job: str, ids: Sequence[str]) -> None:
        """Release these checkpoints of the job; unknown ids are ignored."""
        ...


class RestoreState(Protocol):
    """The coordinator's own memory (owner: `ckpt_ha.restore_coordinator.store`).

    Invariants both the Redis adapter and the fake keep (``tests/support/restores_contract.py``):
    one failure per attempt (recording it twice changes nothing); one stored decision per
    failed attempt, written together with its plan, restart and pins; one verdict per plan
    (the first wins); a lease is held by one owner until released or expired; the trajectory
    keeps at most ``trajectory_limit`` steps, dropping the oldest."""

    async def record_started(self, job: str, started: Started) -> None:
        """Kept while the run goes on (no expiry until `end_run`)."""
        ...

    async def started(self, job: str, attempt: int) -> Started | None: ...

    async def end_run(self, job: str, last_attempt: int) -> None:
        """The run ended at ``last_attempt`` (succeeded, or escalated): its start records may
        now expire like the rest of the state."""
        ...

    async def record_progress(
        self, job: str, points: Sequence[Point], *, last: Point | None = None
    ) -> None: ...

    async def point_at(self, job: str, step: int) -> Point | None: ...

    async def last(self, job: str, attempt: int) -> Point | None: ...

    async def trajectory(self, job: str, steps: Iterable[int]) -> dict[int, Point]:
        """The points at these steps, plus the trajectory's highest step."""
        ...

    async def observe(self, plan: str, point: Point, keep: int) -> list[Point]:
        """Append one of a resumed attempt's reports; all kept so far, in arrival order."""
        ...

    async def set_verdict(self, plan: str, verdict: str) -> bool:
        """True if this call set the plan's verdict (the first one wins)."""
        ...

    async def verdict(self, plan: str) -> str | None: ...

    async def failure_context(
        self, job: str, attempt: int, failure: Failure, storage_key: str | None, same_window: int
    ) -> FailureContext:
        """Record the failure (idempotent), then: the attempt's start, its last progress, the
        job's history (the latest ``same_window`` failures), its exclusions, and the decision
        already taken for this failure."""
        ...

    async def failure_contexts(
        self, failures: Sequence[FailureItem], same_window: int
    ) -> list[FailureContext]:
        """`failure_context` of many failures at once (a burst), in their order; the same
        job's in that order too."""
        ...

    async def held_of(self, jobs: Sequence[str]) -> set[str]:
        """Which of these jobs are held (`held`), read at once."""
        ...

    async def points_at(self, wanted: Sequence[tuple[str, int]]) -> list[Point | None]:
        """`point_at` of many (job, step) at once, in their order."""
        ...

    async def record_storage_error(self, job: str, key: str, at: datetime) -> None: ...

    async def history(self, job: str, attempt: int, same_window: int) -> History: ...

    async def exclude(self, job: str, checkpoint_id: str) -> set[str]:
        """Never restore from this again: a checkpoint id (everywhere) or one location of it
        (`domain.exclusion`); returns every exclusion of the job so far."""
        ...

    async def excluded(self, job: str) -> set[str]:
        """Every exclusion of the job so far (adds none)."""
        ...

    async def decision(self, job: str, attempt: int) -> DecisionRecord | None: ...

    async def failures(self, job: str) -> list[Failure]:
        """The job's logged failures in attempt order."""
        ...

    async def set_held(self, job: str, held: bool) -> None:
        """``ckpt-ha job hold`` / ``unhold``: automatic restores of the job paused or resumed
        (kept until unheld: a hold never expires on its own)."""
        ...

    async def held(self, job: str) -> bool: ...

    async def attend(self, job: str, status: str, reason: str, at: datetime) -> None:
        """The job needs someone since ``at`` (`Attention`); an older event than the stored
        record's changes nothing."""
        ...

    async def settle(self, job: str, at: datetime, only: str = "") -> None:
        """An event of time ``at`` ended what the job needed (only a record of that time or
        older goes; with ``only``, only a record of that status)."""
        ...

    async def attention(self) -> list[Attention]:
        """Every job that needs someone, by job id."""
        ...

    async def lease(self, job: str, attempt: int, owner: str, ttl_s: float) -> bool:
        """Take the right to decide this failure for ``ttl_s`` (False: someone holds it)."""
        ...

    async def release(self, job: str, attempt: int) -> None: ...

    async def lease_many(
        self, failures: Sequence[tuple[str, int]], owner: str, ttl_s: float
    ) -> list[tuple[bool, DecisionRecord | None]]:
        """`lease` of many (job, attempt) at once, for one owner: whether each was taken and,
        when it was, the decision stored for it (`decision`, read under the lease)."""
        ...

    async def release_many(self, failures: Sequence[tuple[str, int]]) -> None: ...

    async def decisions_of(
        self, failures: Sequence[tuple[str, int]]
    ) -> list[DecisionRecord | None]:
        """`decision` of many (job, attempt) at once, in their order."""
        ...

    async def record_decisions(self, writes: Sequence[DecisionWrite]) -> None:
        """`record_decision` of many failures at once (all or nothing), each after settling the
        escalation its plan ends (`DecisionWrite.settles`, as `settle` with ``escalated``)."""
        ...

    async def mark_published_many(
        self, decisions: Sequence[tuple[str, int, DecisionRecord]]
    ) -> None: ...

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
        """Store the decision with its plan, restart and pins, all or nothing."""
        ...

    async def mark_published(self, job: str, attempt: int, decision: DecisionRecord) -> None: ...

    async def recent_restarts(self, since: datetime) -> dict[str, int]:
        """Restarts planned at or after ``since`` per job (jobs with none, or held, are absent),
        from the stored decisions: the level `CkptHaRestartLoop` reads, the same on every
        replica."""
        ...

    async def plan(self, plan_id: str) -> PlanRecord | None: ...

    async def plans_of(self, plan_ids: Sequence[str]) -> dict[str, PlanRecord]:
        """The stored plans among ``plan_ids``, read at once (absent: no such plan)."""
        ...

    async def verdicts_of(self, plan_ids: Sequence[str]) -> dict[str, str]:
        """The verdicts of these plans, read at once (absent: none yet)."""
        ...

    async def record_progress_many(self, points: Mapping[str, Sequence[Point]]) -> None:
        """`record_progress` of many reports at once: each job's ``points`` (in stream order)
        join its trajectory, and the latest of each attempt is that attempt's last point."""
        ...

    async def update_watches(
        self, changes: Mapping[str, Callable[[Watch | None], Watch | None]]
    ) -> dict[str, Watch | None]:
        """`update_watch` of several jobs in one atomic step; returns what was written for
        each (None: nothing)."""
        ...

    async def update_watch(
        self, job: str, change: Callable[[Watch | None], Watch | None]
    ) -> Watch | None:
        """Apply ``change`` to the job's `Watch` atomically (concurrent consumers update the
        same watch): it gets the current one and returns the new one, or None to leave it.
        Returns what was written (None: nothing)."""
        ...

    async def watch(self, job: str) -> Watch | None: ...

    async def heard(self, attempt: str, at: datetime) -> None:
        """A sign of life of ``attempt`` (`liveness.attempt_key`) was handled at ``at`` (the
        coordinator's clock; kept if later than the last). Not a projection of the stream: a
        rebuild has none, and an ended watch forgets it."""
        ...

    async def heard_many(self, attempts: Mapping[str, datetime]) -> None:
        """`heard` of several attempts at once."""
        ...

    async def last_heard(self, attempts: Sequence[str]) -> dict[str, datetime]:
        """When each of these attempts was last heard (absent: never, or forgotten)."""
        ...

    async def overdue(self, now: datetime, limit: int) -> list[Watch]:
        """Watched attempts whose deadline is before ``now``, earliest first (at most
        ``limit``)."""
        ...
