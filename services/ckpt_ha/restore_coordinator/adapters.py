"""The coordinator's reads of the registry and its storage clean-up, over its ports.

Its own memory (``<p>:coord:*``) is owned by `ckpt_ha.restore_coordinator.store`, the pins
(``<p>:pins:<job>``) by `ckpt_ha.registry.pins`; the registry is read through its public
methods only (`CheckpointReads`), never by its key layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ckpt_ha.core.copies import valid_copies
from ckpt_ha.core.locations import LocationNotOwned, plan_removal
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator.domain.closure import Reclaimed
from ckpt_ha.restore_coordinator.domain.selection import Candidate, Selection, select
from ckpt_ha.restore_coordinator.ports import CheckpointReads, ObjectStore
from ckpt_ha.storage import StorageError, bounded, key_for_uri
from ckpt_ha.storage.owned import neighbours, owned_key, remove

__all__ = ["candidate", "primary_present", "reclaim", "selection", "selections"]


def candidate(r: CheckpointRecord) -> Candidate:
    """What the domain needs of a registry record."""
    return Candidate(
        checkpoint_id=r.checkpoint_id,
        step=r.step,
        uri=r.uri,
        state=r.state,
        identity=r.identity,
        created_at=r.created_at,
        exact_resume=r.exact_resume,
        format=r.format.value,
        run_id=r.run_id,
        traceparent=r.traceparent,
        tracestate=r.tracestate,
        copies=tuple(c.uri for c in valid_copies(r.copies)),
    )


SELECTION_PAGE = 4
"""Records read per round trip when choosing: a plan usually needs only the newest two or three
(each record read is a full record's JSON parse, a good share of a decision's CPU in a burst)."""


async def primary_present(store: ObjectStore, job: str, c: Candidate) -> bool:
    """Whether the candidate's primary folder still holds anything (a wiped disk, a deleted
    prefix: nothing). A location outside ``store`` or not the job's is not looked at (True:
    nothing says it is gone). A transient storage error propagates (decided again later)."""
    if key_for_uri(store, c.uri) is None:
        return True
    try:
        key = owned_key(store, job, c.checkpoint_id, c.uri)
    except LocationNotOwned:
        return True

    def any_object() -> bool:
        return store.list_page(f"{key.rstrip('/')}/", page_size=1).items != ()

    try:
        return await bounded.call(any_object)
    except StorageError as exc:
        if exc.transient:
            raise
        return False


async def selection(reads: CheckpointReads, job: str, excluded: Iterable[str]) -> Selection:
    """The newest valid checkpoint of the job not excluded, and the valid one before it, read
    newest first a page at a time and stopping as soon as both are known."""
    skip = set(excluded)
    seen: list[Candidate] = []
    async for page in reads.by_job_pages(job, SELECTION_PAGE):
        seen += [candidate(r) for r in page]
        chosen = select(seen, skip)
        if chosen.previous is not None:
            return chosen
    return select(seen, skip)


async def selections(
    reads: CheckpointReads, wanted: Sequence[tuple[str, set[str]]]
) -> list[Selection]:
    """`selection` of many jobs (job, its exclusions), in their order: every job's newest
    page read at once; a job whose page holds no valid checkpoint before its newest one is
    read on page by page alone."""
    pages = await reads.newest_of_jobs([job for job, _ in wanted], SELECTION_PAGE)
    out: list[Selection] = []
    for job, excluded in wanted:
        page = pages.get(job, ())
        # A generator: `select` stops at the second valid record, the rest never parsed.
        chosen = select((candidate(r) for r in page), excluded)
        if chosen.previous is None and len(page) >= SELECTION_PAGE:
            chosen = await selection(reads, job, excluded)
        out.append(chosen)
    return out


async def reclaim(
    store: ObjectStore,
    job: str,
    leftovers: Sequence[Candidate],
    records: Iterable[CheckpointRecord],
) -> tuple[list[Reclaimed], list[str]]:
    """R11: delete each leftover's location; (what was deleted, unreclaimable with why).

    Only a location the job owns, and never another live record's bytes (``records``: the
    job's records): the folders of other live checkpoints inside it are kept (said in the
    cleaned entry), and a leftover at the same location as a live checkpoint, or inside one,
    is not deleted at all (unreclaimable: its bytes cannot be told from that checkpoint's). A
    transient storage error propagates (the event is retried); a permanent one makes the
    location unreclaimable."""
    others = neighbours(store, records, [c.checkpoint_id for c in leftovers])
    reclaimed: list[Reclaimed] = []
    unreclaimable: list[str] = []
    for c in leftovers:
        if key_for_uri(store, c.uri) is None:
            unreclaimable.append(f"{c.uri}: outside this coordinator's storage root")
            continue
        try:
            key = owned_key(store, job, c.checkpoint_id, c.uri)
        except LocationNotOwned as exc:
            unreclaimable.append(f"{c.uri}: not deleted: {exc.why}")
            continue
        removal = plan_removal(key, others)
        if removal.blocked_by is not None:
            unreclaimable.append(f"{c.uri}: not deleted: {removal.note()}")
            continue
        try:
            removed = await bounded.call(remove, store, [removal])
        except StorageError as exc:
            if exc.transient:
                raise
            unreclaimable.append(f"{c.uri}: {exc}")
            continue
        kept = removal.note() if removal.spared else ""
        reclaimed.append(Reclaimed(c.checkpoint_id, c.uri, removed.deleted, kept))
    return reclaimed, unreclaimable
