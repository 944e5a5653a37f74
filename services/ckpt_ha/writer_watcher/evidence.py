"""Each format's commit evidence, read from storage: when a folder counts as completely written.

Decided from what the writing library writes last, never from a file appearing, so that a
checkpoint still being written is never announced committed (and never verified, called
corrupt or quarantined under its writer):

* ckpt-ha sidecars (`formats.sidecar`) come first: an intent without a commit file is a write
  in progress, whatever the framework's own files say; a commit file makes its files, at their
  exact sizes, the evidence, and gives the step (and, from the intent, the identity). A commit
  file that cannot be read is still the commit marker: verification judges it. An intent that
  cannot be read still says, by its name, that a commit file will follow.
* native: the manifest (written last, create-only) and every shard it lists at its size.
* PyTorch DCP: ``.metadata`` (``FileSystemWriter.finish`` writes ``.metadata.tmp`` after every
  data file and renames it into place) and every data file it references at least as long as
  its furthest entry.
* Hugging Face Trainer (`hf_trainer.is_trainer_folder`): ``trainer_state.json`` is written
  last, in place: committed once it parses with an integer ``global_step`` and the weights are
  complete; its other torch files must be finished zip containers.
* safetensors, written in place header first: a file is complete at exactly the size its header
  declares (`safetensors.declared_size`); a sharded set once its index (written after the
  shards) parses and every shard it names is complete.

Transient storage errors propagate (a scan that fails decides nothing); a file that vanished
between the listing and its read leaves the folder uncommitted until the next scan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import ValidationError

from ckpt_ha.contracts.bounds import MAX_LABEL
from ckpt_ha.contracts.checkpoint import CheckpointFormat, CheckpointIdentity
from ckpt_ha.formats import (
    dcp,
    dcp_metadata,
    detect,
    hf_trainer,
    jsondoc,
    limits,
    native,
    safetensors,
    sidecar,
)
from ckpt_ha.formats.paths import inside
from ckpt_ha.storage import ObjectNotFound, ObjectStore, StorageError
from ckpt_ha.writer_watcher.domain import Evidence

MAX_MARKER_BYTES = limits.MAX_MARKER_BYTES
log = logging.getLogger("ckpt_ha.writer_watcher")
CHANGED = "a file changed while it was read"


def read(store: ObjectStore, folder: str, files: Mapping[str, int]) -> Evidence:
    """What must exist for ``folder`` (holding ``files``: path → size) to count as committed."""
    fmt = detect({p.split("/", 1)[0] for p in files}, folder.rsplit("/", 1)[-1])
    try:
        return _read(store, folder, files, fmt)
    except ObjectNotFound:
        # A file went away between the listing and its read: the next scan decides.
        return Evidence(fmt, None, pending=(CHANGED,))
    except StorageError:
        raise  # an outage: the whole pass is retried, it decides nothing
    except Exception as exc:  # noqa: BLE001 - one folder's content must never blind the scan
        # Not committed on evidence nobody could read: it stays awaited, and a write that
        # never gets readable evidence is reported failed after the stall timeout, with this.
        log.warning("%s: commit evidence unreadable: %r", folder, exc)
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return Evidence(fmt, None, pending=(f"readable commit evidence (unreadable: {why})",))


def _read(
    store: ObjectStore, folder: str, files: Mapping[str, int], fmt: CheckpointFormat
) -> Evidence:
    top = {p for p in files if "/" not in p}  # the folder's own files, not its subfolders
    if top & sidecar.NAMES:
        return _sidecars(store, folder, files, fmt)
    if fmt is CheckpointFormat.NATIVE:
        return _native(store, folder, files)
    if fmt is CheckpointFormat.TORCH_DCP:
        if dcp.METADATA not in files:
            return Evidence(fmt, None, pending=(f"{dcp.METADATA} (written last, by rename)",))
        return _dcp(store, folder, files)
    if fmt is CheckpointFormat.HF_TRAINER:
        return _trainer(store, folder, files, top)
    if fmt is CheckpointFormat.SAFETENSORS:
        return _weights(store, folder, files, top, fmt)
    return Evidence(fmt, None)


def _permanent(exc: StorageError) -> None:
    """Re-raise what the next scan must decide (an outage, a file gone since the listing)."""
    if exc.transient or isinstance(exc, ObjectNotFound):
        raise exc


def _bytes(store: ObjectStore, key: str, size: int) -> bytes | None:
    """The object's bytes; None when it is too large or cannot be read for good."""
    if size > MAX_MARKER_BYTES:
        return None
    try:
        return store.read_bytes(key)
    except StorageError as exc:
        _permanent(exc)
        return None


def _declared(store: ObjectStore, key: str, size: int) -> int | None:
    """`safetensors.declared_size`; a file that cannot be read for good counts at its size
    (verification says why)."""
    try:
        return safetensors.declared_size(store, key, size)
    except StorageError as exc:
        _permanent(exc)
        return size


def _torch_finished(store: ObjectStore, key: str, size: int) -> bool:
    """`hf_trainer.torch_file_complete`; one that cannot be read for good counts finished."""
    try:
        return hf_trainer.torch_file_complete(store, key, size)
    except StorageError as exc:
        _permanent(exc)
        return True


def _json(store: ObjectStore, key: str, size: int) -> object:
    data = _bytes(store, key, size)
    try:
        return None if data is None else jsondoc.parse(data)
    except jsondoc.JsonInvalid:
        return None


def _identity(doc: object) -> CheckpointIdentity | None:
    """The manifest's identity block if it is a valid one; verification judges the rest."""
    if not isinstance(doc, dict):
        return None
    try:
        return CheckpointIdentity.model_validate(doc)
    except ValidationError:
        return None


def _sidecars(
    store: ObjectStore, folder: str, files: Mapping[str, int], fmt: CheckpointFormat
) -> Evidence:
    try:
        intent = sidecar.read_intent(store, folder) if sidecar.INTENT in files else None
    except sidecar.SidecarInvalid:
        intent = None
    except StorageError as exc:
        _permanent(exc)
        intent = None
    if intent is not None and intent.format in set(CheckpointFormat):
        fmt = CheckpointFormat(intent.format)
    identity = intent.identity if intent is not None else None
    run_id = identity.run_id if identity is not None else None
    if sidecar.COMMIT not in files:
        awaited = f"{sidecar.COMMIT} (written last by the ckpt-ha integration)"
        return Evidence(fmt, None, run_id=run_id, identity=identity, pending=(awaited,))
    marker = {sidecar.COMMIT: files[sidecar.COMMIT]}
    try:
        commit = sidecar.read_commit(store, folder)
    except sidecar.SidecarInvalid:
        return Evidence(fmt, marker, run_id=run_id, identity=identity)
    except StorageError as exc:
        _permanent(exc)
        return Evidence(fmt, marker, run_id=run_id, identity=identity)
    if commit is None:
        return Evidence(fmt, None, pending=(CHANGED,))
    required = {path: listed.size for path, listed in commit.files.items()}
    return Evidence(
        fmt,
        {**required, **marker},
        step=commit.step,
        run_id=run_id,
        identity=identity,
    )


def _native(store: ObjectStore, folder: str, files: Mapping[str, int]) -> Evidence:
    fmt = CheckpointFormat.NATIVE
    marker = {native.MANIFEST: files[native.MANIFEST]}
    doc = _json(store, f"{folder}/{native.MANIFEST}", files[native.MANIFEST])
    shards = doc.get("shards") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(shards, list):
        # A manifest that cannot be read is still the commit marker: verification judges it.
        return Evidence(fmt, marker)
    required = dict(marker)
    for shard in shards:
        path = inside(shard.get("path")) if isinstance(shard, dict) else None
        size = jsondoc.count(shard.get("size")) if isinstance(shard, dict) else None
        if path is not None and size is not None:
            required[path] = size
    identity = doc.get("identity")
    run_id = identity.get("run_id") if isinstance(identity, dict) else None
    return Evidence(
        fmt,
        required,
        step=jsondoc.count(doc.get("step")),
        run_id=run_id if isinstance(run_id, str) and len(run_id) <= MAX_LABEL else None,
        identity=_identity(identity),
    )


def _dcp(store: ObjectStore, folder: str, files: Mapping[str, int]) -> Evidence:
    """``.metadata`` plus every data file its storage entries name, each at least as long as
    the furthest entry in it (DCP records offset+length, not file sizes)."""
    marker = {dcp.METADATA: files[dcp.METADATA]}
    fmt = CheckpointFormat.TORCH_DCP
    if files[dcp.METADATA] > dcp_metadata.MAX_METADATA_BYTES:
        return Evidence(fmt, marker)
    data = _bytes(store, f"{folder}/{dcp.METADATA}", files[dcp.METADATA])
    try:
        metadata = dcp_metadata.parse(data or b"")
    except (dcp_metadata.UnsafeMetadata, dcp_metadata.MalformedMetadata):
        # An unreadable or hostile .metadata is still the commit marker: verification judges it.
        return Evidence(fmt, marker)
    needed = metadata.needed_sizes(inside)
    step = None
    if all(files.get(path, -1) >= size for path, size in needed.items()):
        # Only once the data is all there: the step may live in a data file.
        step, _ = dcp.recorded_step(store, folder, metadata)
    return Evidence(fmt, {**needed, **marker}, step=step, at_least=frozenset(needed))


def _trainer(store: ObjectStore, folder: str, files: Mapping[str, int], top: set[str]) -> Evidence:
    """Committed once ``trainer_state.json`` (written last) parses with an integer step and
    every file before it is finished: the weights at their declared sizes, the torch files with
    their zip end record (ranks write their ``rng_state_<rank>.pth`` without a barrier)."""
    fmt = CheckpointFormat.HF_TRAINER
    state = hf_trainer.STATE
    if state not in files:
        return Evidence(fmt, None, pending=(f"{state} (the Trainer writes it last)",))
    data = _bytes(store, f"{folder}/{state}", files[state])
    step = hf_trainer.global_step(data) if data is not None else None
    if step is None:
        awaited = f"{state} (not yet JSON with an integer global_step)"
        return Evidence(fmt, None, pending=(awaited,))
    weights = _weights(store, folder, files, top, fmt)
    required = dict(weights.required or {})
    unfinished = [
        f"{name} (no zip end record yet)"
        for name in sorted(top)
        if (name in hf_trainer.TRAINER_ONLY - {state} or hf_trainer.is_rng_state(name))
        and not _torch_finished(store, f"{folder}/{name}", files[name])
    ]
    # Every other file at its size (they precede the state file).
    others = {path: size for path, size in files.items() if path not in required}
    return Evidence(
        fmt,
        {**others, **required},
        step=step,
        at_least=weights.at_least | {state},
        pending=(*weights.pending, *unfinished),
    )


def _weights(
    store: ObjectStore,
    folder: str,
    files: Mapping[str, int],
    top: set[str],
    fmt: CheckpointFormat,
) -> Evidence:
    """The safetensors weights' evidence.

    With an index: the index parsed and every shard it names complete. Shards without an index:
    the index is awaited (transformers writes it after them). Else every ``*.safetensors`` file
    complete. A Trainer folder without any of these needs ``pytorch_model.bin`` finished. JSON
    written in place (the index, ``trainer_state.json``) parses a moment before its closing
    newline lands: it is required at least at the size it parsed at.
    """
    indexes = sorted(n for n in top if n.endswith(safetensors.INDEX_SUFFIX))
    singles = sorted(n for n in top if n.endswith(".safetensors"))
    required: dict[str, int] = {}
    pending: list[str] = []
    if indexes:
        doc = _json(store, f"{folder}/{indexes[0]}", files[indexes[0]])
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            awaited = f"{indexes[0]} (not yet JSON with a weight_map)"
            return Evidence(fmt, None, pending=(awaited,))
        required[indexes[0]] = files[indexes[0]]
        shards = sorted({s for s in weight_map.values() if isinstance(s, str)})
    elif any(safetensors.SHARD_NAME.fullmatch(n) for n in singles):
        awaited = f"*{safetensors.INDEX_SUFFIX} (written after the shards)"
        return Evidence(fmt, None, pending=(awaited,))
    elif singles:
        shards = singles
    elif hf_trainer.WEIGHTS_BIN in files:
        name = hf_trainer.WEIGHTS_BIN
        if _torch_finished(store, f"{folder}/{name}", files[name]):
            return Evidence(fmt, {name: files[name]})
        return Evidence(fmt, {}, pending=(f"{name} (no zip end record yet)",))
    else:
        awaited = "model weights (model.safetensors, pytorch_model.bin)"
        return Evidence(fmt, None, pending=(awaited,))
    for shard in shards:
        path = inside(shard)
        if path is None:
            continue  # an index naming a path outside: verification calls it unsafe
        if path not in files:
            pending.append(f"{path} (not written yet)")
            continue
        size = _declared(store, f"{folder}/{path}", files[path])
        if size is None:
            pending.append(f"{path} (header not all written yet)")
        else:
            required[path] = size
    return Evidence(fmt, required, pending=tuple(pending), at_least=frozenset(indexes[:1]))
