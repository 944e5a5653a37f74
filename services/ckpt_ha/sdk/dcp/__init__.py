"""Multi-rank PyTorch Distributed Checkpoint (DCP) saves that ckpt-ha can prove complete, and
restores through DCP's own loader after checking what it will read. Needs the ``torch`` extra;
import it as ``from ckpt_ha.sdk import dcp`` (``ckpt_ha.sdk`` itself never imports torch).

`save` is called by every rank of a job (or by one process without a process group):

1. rank 0 writes the intent sidecar (``ckpt-ha.identity.json``: job, run, attempt, environment,
   topology) as the folder's first file, so its time fixes the checkpoint id the writer-watcher
   derives, and announces ``checkpoint.writing`` once; the other ranks wait for its decision
   (a folder that already holds files is `CheckpointExists` on every rank);
2. ``torch.distributed.checkpoint.save`` writes each rank's ``__<rank>_<n>.distcp`` files and
   then rank 0's ``.metadata``;
3. each rank makes its own files durable and checksums them; rank 0 gathers every rank's list
   and writes the commit sidecar (``ckpt-ha.commit.json``: every file's size and checksum, the
   step) last, only once every rank has reported, then announces ``checkpoint.committed`` once.

Until the commit sidecar exists, readers treat the folder as a write in progress (see
`ckpt_ha.formats.sidecar`); a save that fails on any rank writes no commit on any rank. Event
ids are the ones the writer-watcher gives the same facts, so JetStream keeps one of each.

`async_save` does the same on top of ``dcp.async_save``: it returns once the state is staged
(copied to CPU memory), training goes on, and the returned future completes when the commit
sidecar is written. The CPU copy is allocated by the first save, or ahead of it by
`prepare_async` (so the first save stalls the loop no longer than later ones).

`resume` carries out a resume plan on every rank: `.metadata` passes the restricted unpickler
of `ckpt_ha.formats.dcp_metadata` before DCP's reader (which unpickles it unrestricted) sees it,
the files' sizes are checked against the commit sidecar, and only then does ``dcp.load`` run,
the files a rank loads checksummed during its own read (tensors read straight into their
targets where they match), the rest of its share read alongside; no rank returns before every
checksum passed. Rank 0
reports ``resume.loaded`` or ``resume.load_failed`` for the group.

DCP writes and reads through the local filesystem: the storage root must be a path (a shared
filesystem for several hosts), not ``s3://``. Collectives run on the given process group (the
default group otherwise), which must carry Python objects (gloo; NCCL once
``torch.cuda.set_device`` is called), as DCP's own do.
"""

from ckpt_ha.sdk.dcp.background import async_save, prepare_async
from ckpt_ha.sdk.dcp.committing import DcpSaved
from ckpt_ha.sdk.dcp.files import NeedsFilesystemRoot
from ckpt_ha.sdk.dcp.intent import SaveFailed
from ckpt_ha.sdk.dcp.restoring import DcpResumed, resume, share
from ckpt_ha.sdk.dcp.saving import save

__all__ = [
    "DcpResumed",
    "DcpSaved",
    "NeedsFilesystemRoot",
    "SaveFailed",
    "async_save",
    "prepare_async",
    "resume",
    "save",
    "share",
]
