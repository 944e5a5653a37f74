"""What the janitor reads (registry, pins, restore plans, storage) and deletes.

Reads only, through the owners' typed APIs (its ports): the registrar owns the registry,
`ckpt_ha.registry.pins` the R15 pins, `ckpt_ha.restore_coordinator.api` the coordinator's plans,
verdicts and attempt starts. No key of theirs is formatted here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ckpt_ha.core.locations import Removal, plan_removal
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.retention_janitor import domain
from ckpt_ha.retention_janitor.domain import JobView
from ckpt_ha.retention_janitor.ports import (
    ObjectStore,
    PinReads,
    ResumeReads,
    RetentionRegistry,
)
from ckpt_ha.storage import bounded, key_for_uri
from ckpt_ha.storage.owned import Removed, neighbours, record_keys, remove


async def job_views(
    registry: RetentionRegistry,
    pins: PinReads,
    resumes: ResumeReads,
    jobs: Iterable[str] | None = None,
) -> list[JobView]:
    """A fresh read of every job (or the given ones) with its tier and references."""
    plans = domain.plan_protections(await resumes.plans_in_progress())
    names = sorted(jobs) if jobs is not None else await registry.jobs()
    views = []
    for job in names:
        records = await registry.by_job(job)
        if not records:
            continue
        choice = await registry.tier_of(job)
        protections = [*domain.pin_protections(await pins.pins(job)), *plans.get(job, [])]
        views.append(JobView(job, choice.tier, records, protections))
    return views


def locations(store: ObjectStore, record: CheckpointRecord) -> tuple[str, ...]:
    """Where a record's bytes are: its own location and, if moved there, its quarantine copy
    (what `ckpt-ha reconcile` counts as known)."""
    uris = [record.uri, *([record.quarantine_uri] if record.quarantine_uri else [])]
    return tuple(k for u in uris if (k := key_for_uri(store, u)))


async def removals(
    store: ObjectStore, registry: RetentionRegistry, record: CheckpointRecord
) -> list[Removal]:
    """How to delete a record's bytes (its location and its quarantine copy, each checked to be
    its job's: `LocationNotOwned` else) without touching another live record's: the job's other
    checkpoints at, around or inside each location are kept."""
    keys = record_keys(store, record)
    others = neighbours(store, await registry.by_job(record.job_id), [record.checkpoint_id])
    return [plan_removal(key, others) for key in keys]


async def to_thread_remove(store: ObjectStore, plan: Sequence[Removal]) -> Removed:
    return await bounded.call(remove, store, plan)


def all_keys(store: ObjectStore) -> list[str]:
    """The complete listing of the store (raises on any error: never a partial answer)."""
    return [o.key for o in store.list("")]
