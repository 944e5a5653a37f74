"""What the janitor reads (registry, its view of resumes, storage) and deletes, and where its
view stands in the event stream.

The registry is read through its owner's typed API (the registrar owns it; no key of it is
formatted here); the plans, verdicts and R15 pins through the janitor's own view
(`ckpt_ha.retention_janitor.store`), never through the restore-coordinator's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from ckpt_ha.core.locations import Removal, plan_removal
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.retention_janitor import domain
from ckpt_ha.retention_janitor.domain import JobView
from ckpt_ha.retention_janitor.ports import (
    ObjectStore,
    ResumeView,
    RetentionRegistry,
)
from ckpt_ha.storage import bounded, key_for_uri
from ckpt_ha.storage.owned import Removed, neighbours, record_keys, remove


async def job_views(
    registry: RetentionRegistry,
    resumes: ResumeView,
    now: datetime,
    jobs: Iterable[str] | None = None,
) -> list[JobView]:
    """A fresh read of every job (or the given ones) with its tier and references at ``now``."""
    names = sorted(jobs) if jobs is not None else await registry.jobs()
    views = []
    for job in names:
        records = await registry.by_job(job)
        if not records:
            continue
        choice = await registry.tier_of(job)
        refs = domain.resume_protections(await resumes.resumes(job), now, resumes.keep_s)
        views.append(JobView(job, choice.tier, records, refs))
    return views


class ConsumerFeed:
    """`ResumeFeed` from JetStream: the durable that applies ``resume.planned`` to the view has
    nothing left to deliver and nothing delivered unacknowledged (a message acknowledged was
    applied; one waiting for redelivery, parked or failing, is still pending). Not there yet
    (before the service first started): not caught up."""

    def __init__(
        self, jetstream: Callable[[], JetStreamContext], stream: str, durable: str
    ) -> None:
        self.jetstream = jetstream
        self.stream = stream
        self.durable = durable

    async def caught_up(self) -> bool:
        try:
            info = await self.jetstream().consumer_info(self.stream, self.durable)
        except NotFoundError:
            return False
        return not (info.num_pending or info.num_ack_pending)


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
