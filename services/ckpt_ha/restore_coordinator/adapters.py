"""The coordinator's reads of the registry and its storage clean-up, over its ports.

Its own memory (``<p>:coord:*``) is owned by `ckpt_ha.registry.restores`, the pins
(``<p>:pins:<job>``) by `ckpt_ha.registry.pins`; the registry is read through its public
methods only (`CheckpointReads`), never by its key layout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.restore_coordinator.domain import Candidate, Selection, select
from ckpt_ha.restore_coordinator.ports import CheckpointReads, ObjectStore
from ckpt_ha.storage import StorageError, key_for_uri

__all__ = ["candidate", "reclaim", "selection"]


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
    )


SELECTION_PAGE = 16
"""Records read per round trip when choosing: a plan usually needs only the newest few."""


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


def delete_folder(store: ObjectStore, key: str) -> int:
    """Every object under ``key/``; returns how many were deleted (blocking I/O)."""
    keys = [info.key for info in store.list(key.rstrip("/") + "/")]
    for k in keys:
        store.delete(k)
    return len(keys)


async def reclaim(store: ObjectStore, uris: Sequence[str]) -> tuple[list[str], list[str]]:
    """R11: delete each location; (cleaned, unreclaimable with why). A transient storage error
    propagates (the event is retried); a permanent one makes the location unreclaimable."""
    cleaned: list[str] = []
    unreclaimable: list[str] = []
    for uri in uris:
        key = key_for_uri(store, uri)
        if key is None:
            unreclaimable.append(f"{uri}: outside this coordinator's storage root")
            continue
        try:
            await asyncio.to_thread(delete_folder, store, key)
        except StorageError as exc:
            if exc.transient:
                raise
            unreclaimable.append(f"{uri}: {exc}")
            continue
        cleaned.append(uri)
    return cleaned, unreclaimable
