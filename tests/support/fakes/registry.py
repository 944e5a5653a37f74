"""An in-memory checkpoint registry (`ckpt_ha.registry.port.CheckpointRegistry`).

Same semantics as the Redis adapter because it is the same logic: a batch is projected by
`ckpt_ha.core.records.project_batch`, the function the adapter calls; only the storage differs
(dicts instead of keys). `tests/support/registry_contract.py` runs against both.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import (
    Applied,
    CheckpointRecord,
    FenceKey,
    OwnershipChange,
    TierRecord,
    batch_scope,
    project_batch,
)
from ckpt_ha.core.tiers import TierChoice, resolve_tier
from ckpt_ha.registry.port import RegistryUnavailable


class InMemoryRegistry:
    def __init__(self) -> None:
        self.records: dict[str, CheckpointRecord] = {}
        self.applied: set[str] = set()
        self.known_jobs: set[str] = set()
        self.uris: dict[str, set[str]] = {}
        self.owners: dict[str, str] = {}
        self.projects: dict[str, set[str]] = {}
        self.owner_logs: dict[str, list[OwnershipChange]] = {}
        self.tiers: dict[str, TierRecord] = {}
        self.tier_logs: dict[str, list[TierRecord]] = {}
        self.declared: dict[str, str] = {}
        self.fences: dict[FenceKey, int] = {}
        self.reconciled: list[str] = []
        self.down = False
        """Set to make every call raise `RegistryUnavailable` (an outage)."""

    def put(self, *records: CheckpointRecord) -> None:
        """Records put in directly, as the registrar would have projected them (for the tests of
        services that only read the registry)."""
        for r in records:
            self.records[r.checkpoint_id] = r
            self.known_jobs.add(r.job_id)
            self.uris.setdefault(r.uri, set()).add(r.checkpoint_id)

    def _reachable(self) -> None:
        if self.down:
            raise RegistryUnavailable("the in-memory registry is down (test)")

    # --- writes ---------------------------------------------------------------------------------

    async def apply(self, event: Envelope[EventData]) -> Applied:
        [result] = await self.apply_many([event])
        if isinstance(result, Exception):
            raise result
        return result

    async def apply_many(self, events: Sequence[Envelope[EventData]]) -> list[Applied | Exception]:
        self._reachable()
        scope = batch_scope(events)
        outcome = project_batch(
            events,
            [e.id in self.applied for e in events],
            {i: self.records.get(i) for i in scope.checkpoint_ids},
            {j: self.owners.get(j) for j in scope.jobs},
            {u: set(self.uris.get(u, set())) for u in scope.uris},
            {run: self.fences.get(run) for run in scope.fences},
        )
        self.fences.update(outcome.fences)
        self.applied.update(outcome.fresh)
        for cid, record in outcome.records.items():
            self.records[cid] = record
            self.known_jobs.add(record.job_id)
            self.uris.setdefault(record.uri, set()).add(cid)
        for change in outcome.changes:
            if change.from_project is not None:
                self.projects.get(change.from_project, set()).discard(change.job_id)
            self.projects.setdefault(change.to_project, set()).add(change.job_id)
            self.owners[change.job_id] = change.to_project
            self.owner_logs.setdefault(change.job_id, []).append(change)
            self.known_jobs.add(change.job_id)
        for tier in outcome.tiers:
            self.tiers[tier.job_id] = tier
            self.tier_logs.setdefault(tier.job_id, []).append(tier)
            self.known_jobs.add(tier.job_id)
        return outcome.results

    async def declare_tier(self, job_id: str, tier: str | None) -> None:
        self._reachable()
        if tier:
            self.declared[job_id] = tier
        else:
            self.declared.pop(job_id, None)

    async def forget_tombstones(self, records: Sequence[CheckpointRecord]) -> list[str]:
        self._reachable()
        removed = []
        for r in records:
            if r.state is CheckpointState.DELETED and self.records.get(r.checkpoint_id) == r:
                del self.records[r.checkpoint_id]
                self.uris.get(r.uri, set()).discard(r.checkpoint_id)
                if not self.uris.get(r.uri):
                    self.uris.pop(r.uri, None)  # as Redis drops an empty set
                removed.append(r.checkpoint_id)
        return removed

    async def record_reconcile_deletion(self, entry: dict[str, Any]) -> None:
        self._reachable()
        self.reconciled.append(json.dumps(entry, sort_keys=True))

    # --- reads ----------------------------------------------------------------------------------

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        self._reachable()
        return self.records.get(checkpoint_id)

    async def get_many(self, checkpoint_ids: Sequence[str]) -> list[CheckpointRecord | None]:
        self._reachable()
        return [self.records.get(i) for i in checkpoint_ids]

    def _newest_first(self, job_id: str) -> list[CheckpointRecord]:
        # As Redis orders a sorted set read in reverse: by score (step, -1 when unknown), then
        # by member, both descending.
        mine = [r for r in self.records.values() if r.job_id == job_id]
        return sorted(
            mine,
            key=lambda r: (r.step if r.step is not None else -1, r.checkpoint_id),
            reverse=True,
        )

    async def by_job(
        self, job_id: str, *, state: CheckpointState | None = None
    ) -> list[CheckpointRecord]:
        self._reachable()
        return [r for r in self._newest_first(job_id) if state is None or r.state is state]

    async def by_job_pages(
        self, job_id: str, page_size: int = 64
    ) -> AsyncIterator[list[CheckpointRecord]]:
        self._reachable()
        records = self._newest_first(job_id)
        for start in range(0, len(records), page_size):
            yield records[start : start + page_size]

    async def newest_of_jobs(
        self, job_ids: Sequence[str], count: int
    ) -> dict[str, list[CheckpointRecord]]:
        self._reachable()
        return {job: self._newest_first(job)[:count] for job in job_ids}

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        self._reachable()
        return [self.records[i] for i in sorted(self.records) if self.records[i].state is state]

    async def by_state_pages(
        self, state: CheckpointState, page_size: int = 500
    ) -> AsyncIterator[list[CheckpointRecord]]:
        self._reachable()
        found = [r for r in self.records.values() if r.state is state]
        for start in range(0, len(found), page_size):
            yield found[start : start + page_size]

    async def by_uri(self, uri: str) -> list[CheckpointRecord]:
        self._reachable()
        return [self.records[i] for i in sorted(self.uris.get(uri, set()))]

    async def jobs(self) -> list[str]:
        self._reachable()
        return sorted(self.known_jobs)

    async def latest_valid(self, job_id: str) -> CheckpointRecord | None:
        return next(iter(await self.by_job(job_id, state=CheckpointState.VALID)), None)

    async def indexed_states(self, checkpoint_id: str) -> list[CheckpointState]:
        self._reachable()
        record = self.records.get(checkpoint_id)
        return [record.state] if record is not None else []

    async def planned_attempt(self, job_id: str, run_id: str) -> int | None:
        self._reachable()
        return self.fences.get((job_id, run_id))

    async def owner(self, job_id: str) -> str | None:
        self._reachable()
        return self.owners.get(job_id)

    async def owner_log(self, job_id: str) -> list[OwnershipChange]:
        self._reachable()
        return list(self.owner_logs.get(job_id, []))

    async def jobs_of(self, project: str) -> list[str]:
        self._reachable()
        return sorted(self.projects.get(project, set()))

    async def chosen_tier(self, job_id: str) -> TierRecord | None:
        self._reachable()
        return self.tiers.get(job_id)

    async def tier_log(self, job_id: str) -> list[TierRecord]:
        self._reachable()
        return list(self.tier_logs.get(job_id, []))

    async def declared_tier(self, job_id: str) -> str | None:
        self._reachable()
        return self.declared.get(job_id)

    async def tier_of(self, job_id: str) -> TierChoice:
        chosen, declared = await self.chosen_tier(job_id), await self.declared_tier(job_id)
        doc = chosen.model_dump(mode="json") if chosen is not None else None
        return resolve_tier(doc, declared)

    async def reconcile_log(self) -> list[dict[str, Any]]:
        self._reachable()
        return [json.loads(raw) for raw in self.reconciled]

    def snapshot(self) -> dict[str, Any]:
        """Everything it holds, to compare before and after (a duplicate changes nothing)."""
        return copy.deepcopy({k: v for k, v in vars(self).items() if k != "down"})
