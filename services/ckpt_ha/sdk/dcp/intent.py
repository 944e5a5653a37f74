"""The start of a DCP save, shared by `save` and `async_save`: rank 0 resolves who writes where,
writes the intent sidecar as the folder's first file and tells every rank where the checkpoint
goes (or why not)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ckpt_ha.contracts.checkpoint import (
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointWritingV1,
    Topology,
)
from ckpt_ha.core.clock import Clock
from ckpt_ha.formats import sidecar
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.sdk.checkpoints import CheckpointExists, Writer, folder_for
from ckpt_ha.sdk.checkpoints import writer_for as resolve_writer
from ckpt_ha.sdk.dcp.files import filesystem_store
from ckpt_ha.sdk.dcp.group import Group
from ckpt_ha.sdk.protocol import BusEndpoint, Context, trace_context, try_announce
from ckpt_ha.storage import FsStore, ObjectExists


class SaveFailed(Exception):
    """A rank could not write or check its part: no commit was written, on any rank."""

    def __init__(self, uri: str | None, rank: int, reason: str) -> None:
        self.uri = uri
        self.rank = rank
        self.reason = reason
        what = f"checkpoint {uri} was not committed" if uri else "the checkpoint was not started"
        super().__init__(f"{what}: rank {rank}: {reason}")


@dataclass(frozen=True)
class Failed:
    """One rank's failure, as the other ranks learn it."""

    rank: int
    reason: str
    exists_uri: str | None = None
    """Set when the folder already held files (`CheckpointExists` on every rank)."""

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> Failed:
        if isinstance(exc, CheckpointExists):
            return cls(rank, str(exc), exc.uri)
        return cls(rank, f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Request:
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
class Target:
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
class Commitment:
    """What only rank 0 keeps between the intent and the commit."""

    store: FsStore
    writer: Writer
    identity: CheckpointIdentity
    trace: str
    announced_writing: bool
    request: Request
    writing: CheckpointWritingV1 | None = None
    """``writing`` still to announce (`async_save` leaves it to its commit thread)."""

    def announce_writing(self) -> Commitment:
        """This, with ``writing`` announced (when it was left to announce)."""
        if self.writing is None:
            return self
        announced = try_announce(
            self.writer.bus, self.writing, self.request.clock(), traceparent=self.trace
        )
        return dataclasses.replace(self, writing=None, announced_writing=announced)


def _start(request: Request, world_size: int, announce: bool) -> tuple[Target, Commitment]:
    """Rank 0: resolve who writes where, write the intent first, announce ``writing`` (or, not
    ``announce``, leave it to `Commitment.announce_writing`)."""
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
    target = Target(str(store.root), prefix, uri, checkpoint_id, request.step)
    commitment = Commitment(store, writer, identity, trace, False, request, writing)
    return target, commitment.announce_writing() if announce else commitment


def begin(
    group: Group, request: Request, announce: bool = True
) -> tuple[Target, Commitment | None]:
    """Rank 0 starts the checkpoint; every rank learns where, or why not (and raises)."""
    decided: Target | Failed | None = None
    commitment = None
    error: BaseException | None = None
    if group.rank == 0:
        try:
            decided, commitment = _start(request, group.size, announce)
        except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
            decided, error = Failed.of(0, exc), exc
    decided = group.broadcast(decided)  # every rank waits here until the intent is written
    if isinstance(decided, Failed):
        if error is not None:
            raise error  # rank 0's own: a wrong argument reads as itself there
        if decided.exists_uri is not None:
            raise CheckpointExists(decided.exists_uri)
        raise SaveFailed(None, decided.rank, decided.reason)
    assert isinstance(decided, Target)
    return decided, commitment
