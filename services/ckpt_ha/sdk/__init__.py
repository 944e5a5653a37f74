"""Training-side SDK: save checkpoints that ckpt-ha can prove complete, and load them back.

`save()` writes a native checkpoint in this order:

1. the state index (``ckpt-ha.state.json``: the tree's structure and small values) — the
   folder's first file, so its time fixes the checkpoint id exactly as the writer-watcher
   derives it (folder + oldest file's mtime, read back from the store);
2. ``checkpoint.writing`` is announced under that id;
3. every array leaf (bytes, numpy arrays, torch tensors), each durable before the next;
4. the manifest, last and create-only; then ``checkpoint.committed`` is announced.

Both announcements carry the event ids the watcher gives the same facts, so when both report a
save, JetStream and the registry keep one of each. Announcing is best effort: if the bus is
down the save still succeeds, and the watcher announces the checkpoint from storage.

In a runner's multi-process job (``WORLD_SIZE`` > 1) `save` refuses to write one rank's part
as if it were the whole state (`PartialSave`): every rank saves through `ckpt_ha.sdk.dcp`
(PyTorch Distributed Checkpoint: each rank its own shards, rank 0 commits once all are durable;
``from ckpt_ha.sdk import dcp``, which needs the ``torch`` extra and is never imported here).

`load()` reads a checkpoint back, checking each shard's size and checksum against the manifest
as it reads, and rebuilds the state (torch tensors when torch is installed, numpy otherwise).
Nothing is pickled either way.

`progress()` reports a training step without waiting for the bus: one background publisher per
bus and process sends the reports over one connection (`ckpt_ha.sdk.publisher`).

`ckpt_ha.sdk.hf` (the ``hf`` extra, imported by itself, never from here) does the same for a
Hugging Face `Trainer`: a callback that writes ckpt-ha's identity and commit files beside each
save, and a resume through the Trainer's own loader.

Importing the SDK loads no server-side library (faststream, redis, boto3, OpenTelemetry, ...):
boto3 is imported when an ``s3://`` root is opened, OpenTelemetry only if the training code uses
it already.
"""

from __future__ import annotations

import warnings

from ckpt_ha.sdk.checkpoints import (
    CheckpointExists,
    CheckpointUnreadable,
    Loaded,
    PartialSave,
    Saved,
    folder_for,
    load,
    save,
)
from ckpt_ha.sdk.marks import mark_step, slow_phase
from ckpt_ha.sdk.progress import fingerprint, flush_progress, progress, progress_stats
from ckpt_ha.sdk.protocol import BadContext, BusEndpoint, Context, context
from ckpt_ha.sdk.publisher import PublisherStats
from ckpt_ha.sdk.resuming import Resumed, ResumeFailed, resume
from ckpt_ha.sdk.state import INDEX, NeedsTorch, UnsupportedState

__all__ = [
    "INDEX",
    "BadContext",
    "BusEndpoint",
    "CheckpointExists",
    "CheckpointUnreadable",
    "Context",
    "Loaded",
    "NeedsTorch",
    "PartialSave",
    "PublisherStats",
    "ResumeFailed",
    "Resumed",
    "Saved",
    "UnsupportedState",
    "context",
    "fingerprint",
    "flush_progress",
    "folder_for",
    "load",
    "mark_step",
    "progress",
    "progress_stats",
    "resume",
    "save",
    "slow_phase",
]


def __getattr__(name: str) -> object:
    """``ckpt_ha.sdk.Bus``: `BusEndpoint`'s name before it was told apart from the services'
    ``ckpt_ha.bus.broker.Bus``; training code written against it keeps working (with a
    `DeprecationWarning`)."""
    if name == "Bus":
        warnings.warn(
            "ckpt_ha.sdk.Bus is now ckpt_ha.sdk.BusEndpoint", DeprecationWarning, stacklevel=2
        )
        return BusEndpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
