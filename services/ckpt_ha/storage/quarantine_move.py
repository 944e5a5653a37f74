"""Move a quarantined checkpoint's bytes aside before the `quarantined` event says so.

Shared by every service that quarantines (the integrity-checker on a failed verification or a
scrub, the writer-watcher when a valid checkpoint loses shards). Order matters: the bytes move
first, then the event (with ``quarantine_uri``) is published, so a reader of the event finds the
bytes where it says. A transient storage error propagates, so the caller retries (nak) and the
move, being idempotent, resumes; a permanent one (permissions, say) is logged and the checkpoint
is still tagged quarantined in place: the lifecycle matters more than where the bytes sit. So
is one whose location its job does not own, or that holds another live record's bytes: no
quarantine ever moves bytes that are not the checkpoint's own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ckpt_ha.contracts import EventData
from ckpt_ha.contracts.checkpoint import CheckpointQuarantinedV1
from ckpt_ha.core.locations import LocationNotOwned, plan_removal
from ckpt_ha.storage import ObjectStore, StorageError, bounded, key_for_uri
from ckpt_ha.storage.owned import JobRecords, job_neighbours, owned_key
from ckpt_ha.storage.quarantine import quarantine

log = logging.getLogger("ckpt_ha.quarantine")


async def isolate(
    store: ObjectStore, datas: Sequence[EventData], records: JobRecords
) -> list[EventData]:
    """``datas`` with the bytes of every checkpoint they quarantine moved under ``quarantine/``
    and ``quarantine_uri`` set. Events about locations outside ``store`` pass unchanged.

    Nothing is moved (the checkpoint is tagged quarantined in place) from a location its job
    does not own, nor from one holding another live record's bytes (at the same path, around
    it or inside it: ``records`` says where the job's other checkpoints are).
    """
    out: list[EventData] = []
    for data in datas:
        if (
            isinstance(data, CheckpointQuarantinedV1)
            and data.quarantine_uri is None
            and key_for_uri(store, data.uri) is not None
        ):
            data = await _move_aside(store, data, records)
        out.append(data)
    return out


async def _move_aside(
    store: ObjectStore, data: CheckpointQuarantinedV1, records: JobRecords
) -> CheckpointQuarantinedV1:
    try:
        key = owned_key(store, data.job_id, data.checkpoint_id, data.uri)
    except LocationNotOwned as exc:
        log.warning("quarantining %s in place, nothing moved: %s", data.uri, exc)
        return data
    others = await job_neighbours(store, records, data.job_id, [data.checkpoint_id])
    removal = plan_removal(key, others)
    if not removal.whole:
        log.warning("quarantining %s in place, nothing moved: %s", data.uri, removal.note())
        return data
    try:
        moved = await bounded.call(quarantine, store, key, data.job_id, data.checkpoint_id)
    except StorageError as exc:
        if exc.transient:
            raise
        log.exception("quarantining %s in place: moving it failed", key)
        return data
    return data.model_copy(update={"quarantine_uri": store.uri(moved)})
