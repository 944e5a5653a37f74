"""What services need from the checkpoint registry: narrow `Protocol`s a handler depends on.

The registry is a projection of the checkpoint event stream (rebuildable from it). Its Redis
adapter (`ckpt_ha.registry.redis_registry.Registry`) and the in-memory fake of the tests both
implement every Protocol here and pass one contract suite, so handler logic is tested against
the fake and means the same against Redis.

Invariants every implementation keeps:

* one record per checkpoint id; ``uri`` is display only (a resubmitted job writing the same path
  gets another id, and both are kept);
* an event id applied before is a no-op (`Applied.duplicate`), and the same transition twice
  changes nothing;
* only legal lifecycle transitions are applied (`ckpt_ha.core.lifecycle`); an illegal one, a
  pin on a deleted checkpoint, an unknown tier or a stale ownership transfer is that event's
  error, and the other events of a batch still apply;
* an unreachable registry raises `RegistryUnavailable` (a `TransientError`: nak and retry).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.records import Applied, CheckpointRecord, OwnershipChange, TierRecord
from ckpt_ha.core.tiers import TierChoice


class RegistryUnavailable(TransientError):
    """The registry's store could not be reached; the work is retried, nothing was decided."""

    code = "registry_unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"registry (Redis) unavailable: {reason}")


class CheckpointLookup(Protocol):
    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        """The record of one checkpoint (None: the registry never heard of it)."""
        ...


class CheckpointBatchLookup(CheckpointLookup, Protocol):
    async def get_many(self, checkpoint_ids: Sequence[str]) -> list[CheckpointRecord | None]:
        """The records of these checkpoints, in their order (None: never heard of), read at
        once: a consumer that handles a fetched batch asks for all of its records together."""
        ...


class CheckpointReader(CheckpointLookup, Protocol):
    """Read the checkpoint records (what the CLI, the checker's scrub and restores select)."""

    async def by_job(
        self, job_id: str, *, state: CheckpointState | None = None
    ) -> list[CheckpointRecord]:
        """A job's checkpoints, newest step first (optionally only those in ``state``)."""
        ...

    def by_job_pages(
        self, job_id: str, page_size: int = 64
    ) -> AsyncIterator[list[CheckpointRecord]]:
        """`by_job` in pages of ``page_size``, one round trip each: for a reader that usually
        needs only the newest few of a long history (a restore's selection)."""
        ...

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        """Every checkpoint in ``state``, by checkpoint id."""
        ...

    def by_state_pages(
        self, state: CheckpointState, page_size: int = 500
    ) -> AsyncIterator[list[CheckpointRecord]]:
        """`by_state` in pages of about ``page_size``, in no order: for a reader of many (the
        janitor moving old tombstones out)."""
        ...

    async def by_uri(self, uri: str) -> list[CheckpointRecord]:
        """Every checkpoint ever registered at ``uri``, by checkpoint id."""
        ...

    async def jobs(self) -> list[str]:
        """Every job the registry knows, sorted."""
        ...

    async def latest_valid(self, job_id: str) -> CheckpointRecord | None:
        """The job's valid checkpoint with the highest step (None: none is valid)."""
        ...


class OwnershipReader(Protocol):
    """Who owns a job's checkpoints (R5): claimed by the first identity naming a project,
    moved only by a recorded transfer."""

    async def owner(self, job_id: str) -> str | None: ...

    async def owner_log(self, job_id: str) -> list[OwnershipChange]: ...

    async def jobs_of(self, project: str) -> list[str]: ...


class TierReader(Protocol):
    """A job's protection tier (R13): chosen explicitly (recorded), else declared at start."""

    async def tier_of(self, job_id: str) -> TierChoice:
        """The job's tier and where it comes from (`ckpt_ha.core.tiers.resolve_tier`)."""
        ...

    async def chosen_tier(self, job_id: str) -> TierRecord | None: ...

    async def tier_log(self, job_id: str) -> list[TierRecord]: ...

    async def declared_tier(self, job_id: str) -> str | None: ...


class FenceReader(Protocol):
    """The fences of runs (R17): the latest attempt planned for a run, from ``resume.planned``.
    A commit whose identity names that run and an older attempt is held as ``fenced``."""

    async def planned_attempt(self, job_id: str, run_id: str) -> int | None:
        """The latest attempt planned for the run (None: none planned, nothing fenced)."""
        ...


class TierDeclarer(Protocol):
    """Records the tier a job's latest ``job.started`` declared (not in the checkpoint stream)."""

    async def declare_tier(self, job_id: str, tier: str | None) -> None: ...


class RegistryWriter(Protocol):
    """Project checkpoint events (the registrar, and a rebuild from the stream)."""

    async def apply(self, event: Envelope[EventData]) -> Applied:
        """Project one event; raises the error the event alone raised."""
        ...

    async def apply_many(self, events: Sequence[Envelope[EventData]]) -> list[Applied | Exception]:
        """Project events in order, atomically; one result (or error) per event."""
        ...


class TombstoneEvictor(Protocol):
    """Tombstones leaving the hot index once archived (R6; the retention-janitor archives them
    first, `ckpt_ha.retention_janitor.archive`)."""

    async def forget_tombstones(self, records: Sequence[CheckpointRecord]) -> list[str]:
        """Remove each deleted record given from the index, only if it is still exactly that
        record; returns the ids removed."""
        ...


class ReconcileLog(Protocol):
    """Unregistered storage objects ``ckpt-ha reconcile --delete`` removed (R6)."""

    async def record_reconcile_deletion(self, entry: dict[str, Any]) -> None: ...

    async def reconcile_log(self) -> list[dict[str, Any]]: ...


class RegistryReader(CheckpointReader, OwnershipReader, TierReader, FenceReader, Protocol):
    """Every read of the registry."""


class CheckpointRegistry(
    RegistryReader, RegistryWriter, TierDeclarer, TombstoneEvictor, ReconcileLog, Protocol
):
    """The whole registry (what its adapter and its fake implement)."""
