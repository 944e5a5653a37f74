"""Move a quarantined checkpoint's bytes aside before the `quarantined` event says so.

Shared by every service that quarantines (the integrity-checker on a failed verification or a
scrub, the writer-watcher when a valid checkpoint loses shards). Order matters: the bytes move
first, then the event (with ``quarantine_uri``) is published, so a reader of the event finds the
bytes where it says. A transient storage error propagates, so the caller retries (nak) and the
move, being idempotent, resumes; a permanent one (permissions, say) is logged and the checkpoint
is still tagged quarantined in place: the lifecycle matters more than where the bytes sit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import CheckpointQuarantinedV1
from ckpt_ha.storage import ObjectStore, StorageError, key_for_uri
from ckpt_ha.storage.quarantine import quarantine

log = logging.getLogger("ckpt_ha.quarantine")


def _job_folder(job_id: str, key: str) -> str:
    """The job's name in the quarantine layout: its id if that is one path component, else the
    first component of the checkpoint's own key."""
    if job_id and "/" not in job_id and job_id not in (".", ".."):
        return job_id
    return key.split("/", 1)[0]


async def isolate(store: ObjectStore, datas: Sequence[EventData]) -> list[EventData]:
    """``datas`` with the bytes of every checkpoint they quarantine moved under ``quarantine/``
    and ``quarantine_uri`` set. Events about locations outside ``store`` pass unchanged."""
    out: list[EventData] = []
    for data in datas:
        if isinstance(data, CheckpointQuarantinedV1) and data.quarantine_uri is None:
            key = key_for_uri(store, data.uri)
            if key is not None:
                job = _job_folder(data.job_id, key)
                try:
                    moved = await asyncio.to_thread(quarantine, store, key, job, data.checkpoint_id)
                except StorageError as exc:
                    if exc.transient:
                        raise
                    log.exception("quarantining %s in place: moving it failed", key)
                else:
                    data = data.model_copy(update={"quarantine_uri": store.uri(moved)})
        out.append(data)
    return out
