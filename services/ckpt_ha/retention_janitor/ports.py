"""What the retention-janitor needs from the world, as small `Protocol`s.

The janitor never formats another owner's keys: the registry through its public methods
(`RetentionRegistry`). It reads no state of the restore-coordinator's: the plans, verdicts and
R15 pins that protect checkpoints are its own view, built from the events (`ResumeView`, owned
by `ckpt_ha.retention_janitor.store`), and `ResumeFeed` says whether that view has applied every
``resume.planned`` published so far. The composition root passes the Redis and NATS adapters,
the unit tests the fakes of ``tests/support/fakes``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import TierChoice
from ckpt_ha.retention_janitor.resumes import JobResumes
from ckpt_ha.storage.port import ObjectStore

__all__ = [
    "Clock",
    "ObjectStore",
    "Publisher",
    "ResumeFeed",
    "ResumeView",
    "RetentionRegistry",
    "TombstoneArchive",
]


class RetentionRegistry(Protocol):
    """The registry as retention uses it: reads, and the tier a job declared at start (the
    janitor records it; an explicitly chosen tier still wins)."""

    async def jobs(self) -> list[str]: ...

    async def by_job(self, job_id: str) -> list[CheckpointRecord]:
        """A job's checkpoints, newest step first."""
        ...

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None: ...

    async def tier_of(self, job_id: str) -> TierChoice: ...

    async def declare_tier(self, job_id: str, tier: str | None) -> None: ...

    def by_state_pages(
        self, state: CheckpointState, page_size: int = 500
    ) -> AsyncIterator[list[CheckpointRecord]]: ...

    async def forget_tombstones(self, records: Sequence[CheckpointRecord]) -> list[str]:
        """Remove these tombstones from the registry, each only if its record is still exactly
        the one given (it was archived as such); returns the ids removed."""
        ...


class TombstoneArchive(Protocol):
    """The cold archive of tombstones moved out of the registry (R6): written before they
    leave it, read by ``retention audit`` (`ckpt_ha.retention_janitor.archive`)."""

    async def put(self, records: Sequence[CheckpointRecord]) -> None:
        """Store these tombstones durably (again: harmless)."""
        ...

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None: ...

    async def by_job(self, job_id: str) -> list[CheckpointRecord]: ...

    async def everything(self) -> list[CheckpointRecord]: ...


class ResumeView(Protocol):
    """The janitor's view of each job's restores (plans, verdicts, resumed starts, R15 pins),
    a projection of the events. ``keep_s``: how long a plan without a verdict protects its
    checkpoint after the last event about it."""

    keep_s: float

    async def resumes(self, job: str) -> JobResumes:
        """The job's view (empty: nothing references any of its checkpoints)."""
        ...

    async def update(self, job: str, change: Callable[[JobResumes], JobResumes]) -> JobResumes:
        """Apply ``change`` to the job's view atomically (a concurrent writer's change is
        never lost); returns the new view."""
        ...


class ResumeFeed(Protocol):
    """Where the view stands in the event stream."""

    async def caught_up(self) -> bool:
        """True when every ``resume.planned`` published before this call has been applied to
        the view (none waits to be delivered or acknowledged). A retention decision made after
        True sees every plan decided before it began."""
        ...
