"""The end of a DCP save, shared by `save` and `async_save`: every rank makes its files durable
and checksums them, rank 0 writes the commit sidecar last, once every rank has reported."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata

from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import sidecar
from ckpt_ha.formats.dcp import METADATA
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.formats.paths import join
from ckpt_ha.formats.sidecar import Commit, FileEvidence
from ckpt_ha.sdk.dcp.checksumming import ChecksummingFileSystem
from ckpt_ha.sdk.dcp.files import written_by
from ckpt_ha.sdk.dcp.group import Group
from ckpt_ha.sdk.dcp.intent import Commitment, Failed, SaveFailed, Target
from ckpt_ha.sdk.protocol import try_announce
from ckpt_ha.storage import FsStore, ObjectStore
from ckpt_ha.storage.fs_store import fsync

log = logging.getLogger("ckpt_ha.sdk")


@dataclass(frozen=True)
class DcpSaved:
    """A committed DCP checkpoint, the same on every rank."""

    checkpoint_id: str
    uri: str
    step: int
    commit: Commit
    """Every file of the checkpoint (all ranks') with its size and checksum."""
    announced: bool
    """False when ``checkpoint.committed`` could not be published: the writer-watcher will."""
    announced_writing: bool


def _evidence(
    store: ObjectStore, key: str, path: Path, written: Mapping[str, FileEvidence]
) -> FileEvidence:
    """Make one file durable (free when DCP already synced it) and give its size and checksum:
    as it was written when its size on storage is that, else read back."""
    fsync(path)
    seen = written.get(path.name)
    if seen is not None and store.stat(key).size == seen.size:
        return seen
    digest, size = cs.checksum(store, key, cs.WRITE_ALGORITHM)
    return FileEvidence(size=size, checksum=digest)


def _own_files(
    store: FsStore, target: Target, rank: int, written: Mapping[str, FileEvidence]
) -> dict[str, FileEvidence]:
    """This rank's data files (``__<rank>_<n>.distcp``, as DCP's FileSystemWriter names them)."""
    base = f"{target.prefix}/"
    found = {}
    for info in store.list(f"{base}__{rank}_"):
        name = info.key[len(base) :]
        if written_by(name) == rank:
            found[name] = _evidence(store, info.key, target.path / name, written)
    return found


def _write_commit(
    target: Target,
    commitment: Commitment,
    reports: list[dict[str, FileEvidence] | Failed],
    metadata: Metadata,
    written: Mapping[str, FileEvidence],
) -> DcpSaved | Failed:
    """Rank 0, once every rank has reported: the commit sidecar, then ``committed``."""
    failed = next((r for r in reports if isinstance(r, Failed)), None)
    if failed is not None:
        return failed
    files: dict[str, FileEvidence] = {}
    for report in reports:
        files.update(cast(dict[str, FileEvidence], report))
    named = {info.relative_path for info in metadata.storage_data.values()}
    if missing := sorted(named - set(files)):
        return Failed(0, f"{METADATA} names files no rank reported writing: {missing}")
    store, prefix = commitment.store, target.prefix
    files[METADATA] = _evidence(store, join(prefix, METADATA), target.path / METADATA, written)
    fsync(target.path)  # the new names too are durable before the commit says so
    request = commitment.request
    commit = Commit(
        step=target.step,
        files=dict(sorted(files.items())),
        exact_resume=request.exact_resume,
        data_position=request.data_position,
    )
    sidecar.write_commit(store, prefix, commit)
    checkpoint_id = checkpoint_id_on(store, prefix)
    if checkpoint_id != target.checkpoint_id:  # a file listed older than the intent: clock step
        log.warning("checkpoint id moved from %s to %s", target.checkpoint_id, checkpoint_id)
    committed = CheckpointCommittedV1(
        job_id=commitment.identity.job_id,
        checkpoint_id=checkpoint_id,
        uri=target.uri,
        run_id=commitment.writer.run_id,
        step=target.step,
        format=CheckpointFormat.TORCH_DCP,
        identity=commitment.identity,
        shard_count=len(files),
        total_bytes=sum(f.size for f in files.values()),
    )
    announced = try_announce(
        commitment.writer.bus, committed, request.clock(), traceparent=commitment.trace
    )
    return DcpSaved(
        checkpoint_id, target.uri, target.step, commit, announced, commitment.announced_writing
    )


def finish(
    group: Group,
    target: Target,
    commitment: Commitment | None,
    storage_writer: FileSystemWriter,
    metadata: Metadata,
) -> DcpSaved:
    """Every rank reports its files; rank 0 commits only when all did; all learn the outcome."""
    error: BaseException | None = None
    report: dict[str, FileEvidence] | Failed
    fs = storage_writer.fs
    written = fs.written if isinstance(fs, ChecksummingFileSystem) else {}
    try:
        store = commitment.store if commitment is not None else FsStore(target.root)
        report = _own_files(store, target, group.rank, written)
    except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
        report, error = Failed.of(group.rank, exc), exc
    reports = group.gather(report)
    outcome: DcpSaved | Failed | None = None
    if group.rank == 0:
        assert commitment is not None
        try:
            outcome = _write_commit(target, commitment, reports, metadata, written)
        except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
            outcome, error = Failed.of(0, exc), exc
    outcome = group.broadcast(outcome)
    if isinstance(outcome, Failed):
        raise SaveFailed(target.uri, outcome.rank, outcome.reason) from error
    assert isinstance(outcome, DcpSaved)
    return outcome


def writer_for_folder(
    target: Target, writer: Callable[[str], FileSystemWriter] | None
) -> FileSystemWriter:
    built = writer(str(target.path)) if writer is not None else FileSystemWriter(target.path)
    if not isinstance(built, FileSystemWriter):
        raise TypeError(f"writer must build a FileSystemWriter, not {type(built).__name__}")
    if type(built.fs) is FileSystem:  # a writer with a filesystem of its own is read back
        built.fs = ChecksummingFileSystem()
    return built
