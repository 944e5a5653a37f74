"""What the janitor reads (registry, pins, restore plans, storage) and deletes.

Reads only, through the owners' typed APIs (its ports): the registrar owns the registry,
`ckpt_ha.registry.pins` the R15 pins, `ckpt_ha.registry.restores` the coordinator's plans,
verdicts and attempt starts. No key of theirs is formatted here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.retention_janitor import domain
from ckpt_ha.retention_janitor.domain import JobView
from ckpt_ha.retention_janitor.ports import (
    ObjectStore,
    PinReads,
    ResumeReads,
    RetentionRegistry,
)
from ckpt_ha.storage import StorageUnavailable, key_for_uri


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
    """Where a record's bytes are: its own location and, if moved there, its quarantine copy."""
    uris = [record.uri, *([record.quarantine_uri] if record.quarantine_uri else [])]
    return tuple(k for u in uris if (k := key_for_uri(store, u)))


def objects_under(store: ObjectStore, keys: Sequence[str]) -> list[str]:
    """Every object at or under the given locations. A listing error propagates: an incomplete
    listing is never read as "absent"."""
    found: list[str] = []
    for key in keys:
        found += [o.key for o in store.list(key) if o.key == key or o.key.startswith(key + "/")]
    return found


def delete_objects(store: ObjectStore, keys: Sequence[str]) -> int:
    """Delete every object at or under ``keys``; then list again: they must really be gone."""
    found = objects_under(store, keys)
    for key in found:
        store.delete(key)
    left = objects_under(store, keys)
    if left:
        raise StorageUnavailable(
            reason=f"{len(left)} object(s) still listed after delete", backend="janitor"
        )
    return len(found)


async def to_thread_delete(store: ObjectStore, keys: Sequence[str]) -> int:
    return await asyncio.to_thread(delete_objects, store, keys)


def all_keys(store: ObjectStore) -> list[str]:
    """The complete listing of the store (raises on any error: never a partial answer)."""
    return [o.key for o in store.list("")]
