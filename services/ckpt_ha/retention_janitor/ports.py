"""What the retention-janitor needs from the world, as small `Protocol`s.

The janitor never formats another owner's keys: the registry through its public methods
(`RetentionRegistry`), the R15 pins through `ckpt_ha.registry.pins` (`PinReads`), restore plans
and resumes in progress through `ckpt_ha.restore_coordinator.api` (`ResumeReads`). The composition
root passes the Redis adapters, the unit tests the fakes of ``tests/support/fakes``.
"""

from __future__ import annotations

from typing import Protocol

from ckpt_ha.bus.port import Publisher
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.pins import Pin
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import TierChoice
from ckpt_ha.restore_coordinator.records import PlanInProgress
from ckpt_ha.storage.port import ObjectStore

__all__ = ["Clock", "ObjectStore", "PinReads", "Publisher", "ResumeReads", "RetentionRegistry"]


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


class PinReads(Protocol):
    """The R15 pins of a job (a resumed job's restored-from and fallback checkpoints)."""

    async def pins(self, job: str) -> list[Pin]: ...


class ResumeReads(Protocol):
    """Restore plans with no continuity verdict yet (planned, or their attempt resuming)."""

    async def plans_in_progress(self) -> list[PlanInProgress]: ...
