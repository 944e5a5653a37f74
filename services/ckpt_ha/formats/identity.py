"""Checkpoint ids: derived from where and when a checkpoint was written, never from its path alone.

Anyone who sees the same files derives the same id (the writer-watcher from a listing, the SDK
or a test right after writing), and a job resubmitted to write the same path again gets a new
id, because its first file is written at another time.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from ckpt_ha.storage.port import ObjectStore


def checkpoint_id(folder: str, first_written: datetime) -> str:
    """``<job>-<16 hex>`` for the folder ``<job>/<name>`` whose oldest file has that mtime."""
    job = folder.split("/", 1)[0]
    digest = hashlib.sha256(f"{folder}|{first_written.isoformat()}".encode()).hexdigest()[:16]
    return f"{job}-{digest}"


def checkpoint_id_on(store: ObjectStore, folder: str) -> str:
    """The id of the checkpoint currently stored in ``folder`` (it must hold files)."""
    first = min(info.mtime for info in store.list(f"{folder.rstrip('/')}/"))
    return checkpoint_id(folder, first)
