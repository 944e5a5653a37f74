"""What the janitor reads (registry, the coordinator's pins and plans, storage) and deletes.

Reads only; the registrar owns the registry and the coordinator its keys. The coordinator's keys
are read as plain JSON (services never import each other):

* ``<p>:pins:<job>``            hash checkpoint id → ``{"reason", "plan_id", ...}`` (R15 pair)
* ``<p>:coord:plan:<plan>``     ``{"job_id", "checkpoint_id", "attempt", ...}``
* ``<p>:coord:verdict:<plan>``  set once the resumed attempt's continuity is decided
* ``<p>:coord:started:<job>:<attempt>`` ``{"plan_id", ...}``: the resumed attempt started
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence

from ckpt_ha.registry.redis_registry import CheckpointRecord, Registry
from ckpt_ha.retention_janitor.domain import JobView, Protection, ProtectionKind
from ckpt_ha.storage import ObjectStore, StorageUnavailable, key_for_uri


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ReferenceReader:
    """Protections that live outside the checkpoint record: the coordinator's pins and plans."""

    def __init__(self, registry: Registry) -> None:
        self.r = registry.r
        self.p = registry.p

    async def coordinator_pins(self, job: str) -> list[Protection]:
        raws = await self.r.hgetall(f"{self.p}:pins:{job}")
        out = []
        for field, raw in raws.items():
            doc = json.loads(raw)
            reason = str(doc.get("reason", ""))
            ref = f"{reason or 'pinned'} for plan {doc.get('plan_id', '?')}"
            out.append(Protection(_s(field), ProtectionKind.FALLBACK, ref))
        return out

    async def plans(self) -> dict[str, list[Protection]]:
        """Job → protections of restore plans without a verdict yet (planned or resuming)."""
        out: dict[str, list[Protection]] = {}
        keys = [_s(k) async for k in self.r.scan_iter(match=f"{self.p}:coord:plan:*", count=500)]
        for key in keys:
            plan_id = key.rsplit(":", 1)[1]
            raw, verdict = await self.r.mget(key, f"{self.p}:coord:verdict:{plan_id}")
            if not raw or verdict:
                continue
            doc = json.loads(raw)
            job, ckpt, attempt = doc.get("job_id"), doc.get("checkpoint_id"), doc.get("attempt")
            if not job or not ckpt:
                continue
            started = await self.r.get(f"{self.p}:coord:started:{job}:{attempt}")
            resuming = started is not None and json.loads(started).get("plan_id") == plan_id
            if resuming:
                p = Protection(ckpt, ProtectionKind.RESUME, f"attempt {attempt} of plan {plan_id}")
            else:
                p = Protection(ckpt, ProtectionKind.RESTORE_PLAN, f"plan {plan_id}")
            out.setdefault(job, []).append(p)
        return out


async def job_views(
    registry: Registry, refs: ReferenceReader, jobs: Iterable[str] | None = None
) -> list[JobView]:
    """A fresh read of every job (or the given ones) with its tier and references."""
    plans = await refs.plans()
    names = sorted(jobs) if jobs is not None else await registry.jobs()
    views = []
    for job in names:
        records = await registry.by_job(job)
        if not records:
            continue
        choice = await registry.tier_of(job)
        protections = [*await refs.coordinator_pins(job), *plans.get(job, [])]
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
