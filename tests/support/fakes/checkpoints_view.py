"""A small in-memory read side of the registry for the restore-coordinator's and the
retention-janitor's unit tests: the public reads they use (`get`, `by_job`, `jobs`, `tier_of`)
and the declared tier the janitor records. Records are put in directly, as the registrar would
have projected them. (The full in-memory registry lives in ``tests/support/fakes/registry.py``.)
"""

from __future__ import annotations

from ckpt_ha.core.tiers import TierChoice, resolve_tier
from ckpt_ha.registry.redis_registry import CheckpointRecord


class CheckpointsView:
    def __init__(self, *records: CheckpointRecord) -> None:
        self.records: dict[str, CheckpointRecord] = {}
        self.declared: dict[str, str] = {}
        self.chosen: dict[str, dict[str, str]] = {}
        self.put(*records)

    def put(self, *records: CheckpointRecord) -> None:
        for r in records:
            self.records[r.checkpoint_id] = r

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        return self.records.get(checkpoint_id)

    async def by_job(self, job_id: str) -> list[CheckpointRecord]:
        """Newest step first (ties: the larger id first), as the registry's sorted set."""
        mine = [r for r in self.records.values() if r.job_id == job_id]
        return sorted(
            mine,
            key=lambda r: (r.step if r.step is not None else -1, r.checkpoint_id),
            reverse=True,
        )

    async def jobs(self) -> list[str]:
        return sorted({r.job_id for r in self.records.values()})

    async def tier_of(self, job_id: str) -> TierChoice:
        return resolve_tier(self.chosen.get(job_id), self.declared.get(job_id))

    async def declare_tier(self, job_id: str, tier: str | None) -> None:
        if tier:
            self.declared[job_id] = tier
        else:
            self.declared.pop(job_id, None)
