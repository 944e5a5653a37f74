"""Physical quarantine: a checkpoint's objects moved aside, under ``quarantine/<job>/<id>/``.

A quarantined checkpoint keeps its bytes (for a post-mortem, or a release after review) but
leaves the job's folder, so nothing that lists the folder (a restore, a training script picking
"the latest step") can load it. The layout, in the same store:

    quarantine/<job>/<checkpoint_id>/<path inside the checkpoint folder>

The move is a sequence of single-object moves, so it is not atomic; it is ordered so that a
listing taken half-way never looks like a complete or a new checkpoint:

* commit markers first (the manifest, an index, ``trainer_state.json``, ``.metadata``): without
  its marker a folder is not evidence of a commit, and the writer-watcher ignores it;
* then the other files newest first, so the oldest file (whose mtime is part of the checkpoint id)
  stays in place until the end and the half-moved folder keeps its id.

Repeating either function after a crash finishes the job: what was moved is not listed again,
and a file another mover took meanwhile is skipped.
`restore` is the reverse order (oldest first, markers last), so a folder comes back complete
before its marker does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from ckpt_ha.core.locations import QUARANTINE
from ckpt_ha.storage.errors import InvalidKey, ObjectNotFound
from ckpt_ha.storage.port import ObjectInfo, ObjectStore, validate_key

TOP = QUARANTINE

# Names as in ckpt_ha.formats (native.MANIFEST, sidecar.COMMIT, safetensors.INDEX_SUFFIX, the
# HF Trainer and torch DCP markers); kept here so storage does not depend on formats, and a unit
# test keeps the two in step.
MARKER_NAMES = frozenset(
    {"ckpt-ha.manifest.json", "ckpt-ha.commit.json", "trainer_state.json", ".metadata"}
)
MARKER_SUFFIXES = (".safetensors.index.json",)


def is_commit_marker(path: str) -> bool:
    """True for a file whose presence says the folder was committed (top level only)."""
    return "/" not in path and (path in MARKER_NAMES or path.endswith(MARKER_SUFFIXES))


def quarantine_key(job: str, checkpoint_id: str) -> str:
    """``quarantine/<job>/<checkpoint_id>``: one folder per checkpoint, grouped by job."""
    for part, what in ((job, "job"), (checkpoint_id, "checkpoint id")):
        if "/" in part:
            raise InvalidKey(part, reason=f"{what} must be one path component")
    return validate_key(f"{TOP}/{job}/{checkpoint_id}")


def _members(store: ObjectStore, folder: str) -> list[tuple[str, ObjectInfo]]:
    prefix = f"{validate_key(folder.rstrip('/'))}/"
    return [(info.key[len(prefix) :], info) for info in store.list(prefix)]


def _moving_order(item: tuple[str, ObjectInfo]) -> tuple[bool, float, str]:
    path, info = item
    return (not is_commit_marker(path), -info.mtime.timestamp(), path)


def taking_apart(folder: str, objects: Iterable[ObjectInfo]) -> list[ObjectInfo]:
    """``objects`` under ``folder`` in the order to move or delete them one by one: commit
    markers first, then newest first. A listing taken half-way shows no commit and keeps the
    folder's id, so the writer-watcher never takes it for a new write (retention's deletes use
    the quarantine move's order)."""
    prefix = f"{folder.rstrip('/')}/"
    return sorted(objects, key=lambda o: _moving_order((o.key.removeprefix(prefix), o)))


def quarantine(store: ObjectStore, key: str, job: str, checkpoint_id: str) -> str:
    """Move every object under the folder ``key`` to `quarantine_key` and return that key.

    Idempotent: a folder already (partly) moved has only its remaining objects moved. Transient
    storage errors propagate (`StorageError.transient`): the caller retries the whole call.
    """
    target = quarantine_key(job, checkpoint_id)
    for path, _ in sorted(_members(store, key), key=_moving_order):
        _move(store, f"{key}/{path}", f"{target}/{path}")
    return target


def restore(store: ObjectStore, quarantine_key: str, key: str) -> None:
    """Move a quarantined folder back to ``key`` (oldest first, commit markers last)."""
    for path, _ in sorted(_members(store, quarantine_key), key=_moving_order, reverse=True):
        _move(store, f"{quarantine_key}/{path}", f"{key}/{path}")


def _move(store: ObjectStore, src: str, dst: str) -> None:
    # Two quarantiners racing (the checker's scrub and the watcher, on one lost shard) move
    # the same files: one that is gone was moved by the other, which is what both wanted.
    with contextlib.suppress(ObjectNotFound):
        store.move(src, dst)
