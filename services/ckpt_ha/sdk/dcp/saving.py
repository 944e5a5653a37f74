"""`save` and `async_save`: every rank writes its own DCP files, rank 0 writes the intent first
and the commit last, once every rank has reported its files (see the package doc)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointWritingV1,
    Topology,
)
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import sidecar
from ckpt_ha.formats.dcp import METADATA
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.formats.paths import join
from ckpt_ha.formats.sidecar import Commit, FileEvidence
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.checkpoints import CheckpointExists, Writer, folder_for
from ckpt_ha.sdk.checkpoints import writer_for as resolve_writer
from ckpt_ha.sdk.dcp.checksumming import ChecksummingFileSystem
from ckpt_ha.sdk.dcp.files import filesystem_store, written_by
from ckpt_ha.sdk.dcp.group import Group
from ckpt_ha.sdk.protocol import BusEndpoint, Context, context, trace_context, try_announce
from ckpt_ha.storage import FsStore, ObjectExists, ObjectStore
from ckpt_ha.storage.fs_store import fsync

log = logging.getLogger("ckpt_ha.sdk")


class SaveFailed(Exception):
    """A rank could not write or check its part: no commit was written, on any rank."""

    def __init__(self, uri: str | None, rank: int, reason: str) -> None:
        self.uri = uri
        self.rank = rank
        self.reason = reason
        what = f"checkpoint {uri} was not committed" if uri else "the checkpoint was not started"
        super().__init__(f"{what}: rank {rank}: {reason}")


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


@dataclass(frozen=True)
class _Failed:
    """One rank's failure, as the other ranks learn it."""

    rank: int
    reason: str
    exists_uri: str | None = None
    """Set when the folder already held files (`CheckpointExists` on every rank)."""

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> _Failed:
        if isinstance(exc, CheckpointExists):
            return cls(rank, str(exc), exc.uri)
        return cls(rank, f"{type(exc).__name__}: {exc}")


# -- saving ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    step: int
    job_id: str | None
    storage_root: str | None
    ctx: Context | None
    run_id: str | None
    attempt: int | None
    project: str | None
    model_version: str | None
    code_version: str | None
    data_snapshot: str | None
    config_hash: str | None
    topology: Topology | None
    exact_resume: bool
    data_position: int | None
    bus: BusEndpoint | None
    clock: Clock


@dataclass(frozen=True)
class _Target:
    """Where rank 0 decided the checkpoint goes, and its id: what every rank needs."""

    root: str
    prefix: str
    uri: str
    checkpoint_id: str
    step: int

    @property
    def path(self) -> Path:
        return Path(self.root) / self.prefix


@dataclass(frozen=True)
class _Commitment:
    """What only rank 0 keeps between the intent and the commit."""

    store: FsStore
    writer: Writer
    identity: CheckpointIdentity
    trace: str
    announced_writing: bool
    request: _Request
    writing: CheckpointWritingV1 | None = None
    """``writing`` still to announce (`async_save` leaves it to its commit thread)."""

    def announce_writing(self) -> _Commitment:
        """This, with ``writing`` announced (when it was left to announce)."""
        if self.writing is None:
            return self
        announced = try_announce(
            self.writer.bus, self.writing, self.request.clock(), traceparent=self.trace
        )
        return dataclasses.replace(self, writing=None, announced_writing=announced)


def _start(request: _Request, world_size: int, announce: bool) -> tuple[_Target, _Commitment]:
    """Rank 0: resolve who writes where, write the intent first, announce ``writing`` (or, not
    ``announce``, leave it to `_Commitment.announce_writing`)."""
    ctx = request.ctx
    job_id = request.job_id or (ctx.job_id if ctx is not None else None)
    root = request.storage_root or (ctx.storage_root if ctx is not None else None)
    if job_id is None or root is None:
        raise ValueError("job_id and storage_root are required outside a runner")
    if request.step < 0:
        raise ValueError(f"step {request.step} must be >= 0")
    store = filesystem_store(root)
    writer = resolve_writer(
        job_id,
        ctx,
        run_id=request.run_id,
        attempt=request.attempt,
        code_version=request.code_version,
        topology=request.topology,
        bus=request.bus,
    )
    if writer.topology is None:
        writer = dataclasses.replace(writer, topology=Topology(world_size=world_size))
    prefix = folder_for(job_id, request.step, writer.attempt)
    uri = store.uri(prefix)
    now = request.clock()
    identity = writer.identity(
        frameworks=frozenset({"torch"}),
        image=None,
        created_at=now,
        project=request.project,
        model_version=request.model_version,
        data_snapshot=request.data_snapshot,
        config_hash=request.config_hash,
    )
    if next(iter(store.list(f"{prefix}/")), None) is not None:
        raise CheckpointExists(uri)
    intent = sidecar.Intent(
        identity=identity,
        format=CheckpointFormat.TORCH_DCP.value,
        step=request.step,
        world_size=world_size,
    )
    try:
        sidecar.write_intent(store, prefix, intent)  # the folder's first file: it fixes the id
    except ObjectExists:
        raise CheckpointExists(uri) from None
    checkpoint_id = checkpoint_id_on(store, prefix)
    trace = trace_context()  # one trace for the checkpoint: writing, committed and what follows
    writing = CheckpointWritingV1(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        uri=uri,
        run_id=writer.run_id,
        step=request.step,
        format=CheckpointFormat.TORCH_DCP,
    )
    target = _Target(str(store.root), prefix, uri, checkpoint_id, request.step)
    commitment = _Commitment(store, writer, identity, trace, False, request, writing)
    return target, commitment.announce_writing() if announce else commitment


def _begin(
    group: Group, request: _Request, announce: bool = True
) -> tuple[_Target, _Commitment | None]:
    """Rank 0 starts the checkpoint; every rank learns where, or why not (and raises)."""
    decided: _Target | _Failed | None = None
    commitment = None
    error: BaseException | None = None
    if group.rank == 0:
        try:
            decided, commitment = _start(request, group.size, announce)
        except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
            decided, error = _Failed.of(0, exc), exc
    decided = group.broadcast(decided)  # every rank waits here until the intent is written
    if isinstance(decided, _Failed):
        if error is not None:
            raise error  # rank 0's own: a wrong argument reads as itself there
        if decided.exists_uri is not None:
            raise CheckpointExists(decided.exists_uri)
        raise SaveFailed(None, decided.rank, decided.reason)
    assert isinstance(decided, _Target)
    return decided, commitment


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
    store: FsStore, target: _Target, rank: int, written: Mapping[str, FileEvidence]
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
    target: _Target,
    commitment: _Commitment,
    reports: list[dict[str, FileEvidence] | _Failed],
    metadata: Metadata,
    written: Mapping[str, FileEvidence],
) -> DcpSaved | _Failed:
    """Rank 0, once every rank has reported: the commit sidecar, then ``committed``."""
    failed = next((r for r in reports if isinstance(r, _Failed)), None)
    if failed is not None:
        return failed
    files: dict[str, FileEvidence] = {}
    for report in reports:
        files.update(cast(dict[str, FileEvidence], report))
    named = {info.relative_path for info in metadata.storage_data.values()}
    if missing := sorted(named - set(files)):
        return _Failed(0, f"{METADATA} names files no rank reported writing: {missing}")
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


def _commit(
    group: Group,
    target: _Target,
    commitment: _Commitment | None,
    storage_writer: FileSystemWriter,
    metadata: Metadata,
) -> DcpSaved:
    """Every rank reports its files; rank 0 commits only when all did; all learn the outcome."""
    error: BaseException | None = None
    report: dict[str, FileEvidence] | _Failed
    fs = storage_writer.fs
    written = fs.written if isinstance(fs, ChecksummingFileSystem) else {}
    try:
        store = commitment.store if commitment is not None else FsStore(target.root)
        report = _own_files(store, target, group.rank, written)
    except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
        report, error = _Failed.of(group.rank, exc), exc
    reports = group.gather(report)
    outcome: DcpSaved | _Failed | None = None
    if group.rank == 0:
        assert commitment is not None
        try:
            outcome = _write_commit(target, commitment, reports, metadata, written)
        except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
            outcome, error = _Failed.of(0, exc), exc
    outcome = group.broadcast(outcome)
    if isinstance(outcome, _Failed):
        raise SaveFailed(target.uri, outcome.rank, outcome.reason) from error
    assert isinstance(outcome, DcpSaved)
    return outcome


def _storage_writer(
    target: _Target, writer: Callable[[str], FileSystemWriter] | None
) -> FileSystemWriter:
    built = writer(str(target.path)) if writer is not None else FileSystemWriter(target.path)
    if not isinstance(built, FileSystemWriter):
        raise TypeError(f"writer must build a FileSystemWriter, not {type(built).__name__}")
    if type(built.fs) is FileSystem:  # a writer with a filesystem of its own is read back
        built.fs = ChecksummingFileSystem()
    return built


@marks.during("save")
def save(
    state_dict: dict[str, Any],
    *,
    step: int,
    job_id: str | None = None,
    storage_root: str | None = None,
    ctx: Context | None = None,
    process_group: dist.ProcessGroup | None = None,
    run_id: str | None = None,
    attempt: int | None = None,
    project: str | None = None,
    model_version: str | None = None,
    code_version: str | None = None,
    data_snapshot: str | None = None,
    config_hash: str | None = None,
    topology: Topology | None = None,
    exact_resume: bool = True,
    data_position: int | None = None,
    bus: BusEndpoint | None = None,
    writer: Callable[[str], FileSystemWriter] | None = None,
    clock: Clock = utc_now,
) -> DcpSaved:
    """Save ``state_dict`` with ``torch.distributed.checkpoint`` as checkpoint
    ``<job>/step-<step:08d>`` (``-a<attempt>`` on a later attempt) and commit it; call it on every
    rank of ``process_group`` (default: the default group; no group initialised: this process).

    Under a runner, ``job_id``, ``storage_root`` (``CKPT_HA_STORAGE_ROOT``), run, attempt, code
    version, topology, bus and environment default to the attempt's, so the identity compares
    identical with ``job.started``; without a topology the group's size is the world size.
    Rank 0's arguments decide. ``writer`` builds the ``FileSystemWriter`` for the folder (e.g.
    more threads); ``data_position`` is recorded in the commit.

    Returns the same `DcpSaved` on every rank. Raises `CheckpointExists` on every rank when the
    folder already holds files; when rank 0 cannot start (a wrong argument, storage), its error
    there and `SaveFailed` on the others; and `SaveFailed` on every rank when a rank could not
    write or check its files (no commit is written: readers see a write that never finished).
    """
    request = _Request(
        step=step,
        job_id=job_id,
        storage_root=storage_root,
        ctx=ctx if ctx is not None else context(),
        run_id=run_id,
        attempt=attempt,
        project=project,
        model_version=model_version,
        code_version=code_version,
        data_snapshot=data_snapshot,
        config_hash=config_hash,
        topology=topology,
        exact_resume=exact_resume,
        data_position=data_position,
        bus=bus,
        clock=clock,
    )
    group = Group.of(process_group)
    target, commitment = _begin(group, request)
    storage_writer = _storage_writer(target, writer)
    metadata = dcp_save(
        state_dict,
        storage_writer=storage_writer,
        process_group=group.pg,
        no_dist=group.pg is None,
    )
    return _commit(group, target, commitment, storage_writer, metadata)


# -- saving in the background ------------------------------------------------------------------


@dataclass
class _Background:
    """This process's background saving: the group it runs on, the save in flight, and the
    stager that copies the state to CPU memory."""

    world: object = None
    """The default group the checkpoint group was made for (a new one needs a new group)."""
    group: dist.ProcessGroup | None = None
    in_flight: Future[DcpSaved] | None = None
    stager: DefaultStager | None = None
    """Kept between saves: it keeps its CPU copies of the tensors (DCP's staging cache), so a
    save after the first only copies into them instead of allocating them again."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    committer: ThreadPoolExecutor | None = None
    """One long-lived thread that waits for each upload and commits it: handing a save to it
    costs the loop no thread start (`prepare_async` starts it)."""

    def commit_thread(self) -> ThreadPoolExecutor:
        if self.committer is None:  # its thread is joined at exit: a commit is never cut short
            self.committer = ThreadPoolExecutor(1, thread_name_prefix="ckpt-ha-dcp-commit")
        return self.committer

    def staging(self) -> DefaultStager:
        if self.stager is None:
            accelerator = torch.accelerator.is_available()
            self.stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=accelerator,
                    use_shared_memory=False,
                    use_async_staging=False,  # the state is copied before async_save returns
                    use_non_blocking_copy=False,
                )
            )
        return self.stager


_BACKGROUND = _Background()


def _background_group(process_group: dist.ProcessGroup | None) -> Group:
    """The group the background collectives run on: ``process_group``, else a gloo group of all
    ranks made once (a collective call) and kept, so that they never interleave with the
    training loop's own collectives on the default group."""
    if process_group is not None or not (dist.is_available() and dist.is_initialized()):
        return Group(process_group)
    world = dist.group.WORLD
    if _BACKGROUND.group is None or _BACKGROUND.world is not world:
        group = dist.new_group(backend="gloo")
        if not isinstance(group, dist.ProcessGroup):  # this rank is not in the default group
            raise RuntimeError("async_save must be called on every rank of the default group")
        _BACKGROUND.group, _BACKGROUND.world = group, world
    return Group(_BACKGROUND.group)


def prepare_async(state_dict: dict[str, Any]) -> None:
    """Allocate the CPU copy `async_save` stages the state into, now, so that the first
    `async_save` only copies into it as later ones do (the allocation, pinned memory with an
    accelerator, is the first save's extra stall). Call it once the model and optimizer state
    exist (e.g. after the first optimizer step, when the optimizer has its state), with the
    state dict later saves will pass; it copies the state once and writes nothing. Optional:
    without it, the first `async_save` allocates."""
    with _BACKGROUND.lock:
        previous = _BACKGROUND.in_flight
        if previous is not None:
            wait_for_futures([previous])  # the stager is not thread-safe
        _BACKGROUND.staging().stage(state_dict)
        _BACKGROUND.commit_thread().submit(lambda: None).result()  # its thread started now


def _finish_in_background(
    upload: Future[Metadata],
    group: Group,
    target: _Target,
    commitment: _Commitment | None,
    storage_writer: FileSystemWriter,
    done: Future[DcpSaved],
) -> None:
    try:
        if commitment is not None:  # off the training loop: a bus round trip, or its timeout
            commitment = commitment.announce_writing()
        metadata = upload.result()  # DCP's own collectives: it fails on every rank or on none
        done.set_result(_commit(group, target, commitment, storage_writer, metadata))
    except BaseException as exc:  # noqa: BLE001 -- delivered through the future, not lost
        done.set_exception(exc)


@marks.during("save")
def async_save(
    state_dict: dict[str, Any],
    *,
    step: int,
    job_id: str | None = None,
    storage_root: str | None = None,
    ctx: Context | None = None,
    process_group: dist.ProcessGroup | None = None,
    run_id: str | None = None,
    attempt: int | None = None,
    project: str | None = None,
    model_version: str | None = None,
    code_version: str | None = None,
    data_snapshot: str | None = None,
    config_hash: str | None = None,
    topology: Topology | None = None,
    exact_resume: bool = True,
    data_position: int | None = None,
    bus: BusEndpoint | None = None,
    writer: Callable[[str], FileSystemWriter] | None = None,
    clock: Clock = utc_now,
) -> Future[DcpSaved]:
    """`save` on top of ``dcp.async_save``: returns once the intent is written and the state is
    staged (copied to CPU memory), so training goes on while the files are written (waited
    for and committed by one long-lived thread of this process, which also announces
    ``checkpoint.writing``: a connection to the bus per event, or its timeout when the bus is
    down, never stalls the loop); the future
    completes with `DcpSaved` once every rank's files are durable and the commit is written
    (or fails with `SaveFailed` / DCP's error, and nothing is committed).

    The CPU copy is kept between saves (DCP's staging cache, one copy of the state in memory):
    the first save allocates it, unless `prepare_async` did beforehand; later saves only copy
    into it.

    Call it on every rank. The background collectives (DCP's and the commit's) run on
    ``process_group``, which nothing else may use meanwhile; by default on a gloo group of all
    ranks, made on the first call (all ranks make that call together, as with any new group).
    A save waits for the previous one of this process to finish first, so saves and their
    collectives never overlap.
    """
    request = _Request(
        step=step,
        job_id=job_id,
        storage_root=storage_root,
        ctx=ctx if ctx is not None else context(),
        run_id=run_id,
        attempt=attempt,
        project=project,
        model_version=model_version,
        code_version=code_version,
        data_snapshot=data_snapshot,
        config_hash=config_hash,
        topology=topology,
        exact_resume=exact_resume,
        data_position=data_position,
        bus=bus,
        clock=clock,
    )
    with _BACKGROUND.lock:
        previous = _BACKGROUND.in_flight
        if previous is not None:
            wait_for_futures([previous])
        group = _background_group(process_group)
        target, commitment = _begin(group, request, announce=False)
        storage_writer = _storage_writer(target, writer)
        staged = dcp_async_save(
            state_dict,
            storage_writer=storage_writer,
            process_group=group.pg,
            async_stager=_BACKGROUND.staging(),
            no_dist=group.pg is None,
        )
        upload = staged.upload_completion if isinstance(staged, AsyncSaveResponse) else staged
        done: Future[DcpSaved] = Future()
        done.set_running_or_notify_cancel()  # a commit cannot be called off halfway
        _BACKGROUND.commit_thread().submit(
            _finish_in_background,
            cast(Future[Metadata], upload),
            group,
            target,
            commitment,
            storage_writer,
            done,
        )
        _BACKGROUND.in_flight = done
    return done
