"""Save a native checkpoint that ckpt-ha can prove complete, and load one back checking every
shard (see the package doc for the order of a save)."""

from __future__ import annotations

import contextlib
import functools
import logging
import platform
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from typing import Any, BinaryIO, cast

import numpy as np
from pydantic import ValidationError

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointWritingV1,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.core.locations import job_folder
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import native, parallel
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.sdk import marks
from ckpt_ha.sdk import state as codec
from ckpt_ha.sdk.protocol import (
    BusEndpoint,
    Context,
    context,
    launched_as,
    trace_context,
    try_announce,
)
from ckpt_ha.sdk.state import INDEX, NeedsTorch, Tensors, UnreadableState
from ckpt_ha.storage import FsStore, ObjectNotFound, ObjectStore, open_store

log = logging.getLogger("ckpt_ha.sdk")


class CheckpointExists(Exception):
    """The target folder already holds files (an earlier attempt, or another run)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(
            f"{uri} already holds files. A checkpoint's id comes from its folder and its oldest "
            "file, so writing there again would be confused with the earlier write: save under "
            "another step, or remove the leftovers first"
        )


class CheckpointUnreadable(Exception):
    """`load` found the checkpoint incomplete or not matching its manifest."""

    def __init__(self, uri: str, verdict: str, reason: str) -> None:
        self.uri = uri
        self.verdict = verdict
        """``incomplete`` (no manifest) or ``corrupt`` (a shard or the index does not match)."""
        self.reason = reason
        super().__init__(f"{uri}: {verdict}: {reason}")


@dataclass(frozen=True)
class Saved:
    checkpoint_id: str
    uri: str
    step: int
    manifest: native.Manifest
    announced: bool
    """False when `committed` could not be published: the writer-watcher will announce it."""
    announced_writing: bool = False


@dataclass(frozen=True)
class Loaded:
    state: dict[str, Any]
    step: int
    uri: str
    manifest: native.Manifest

    @property
    def identity(self) -> CheckpointIdentity | None:
        return self.manifest.identity


class PartialSave(Exception):
    """`save` was called in a multi-process job, where one process holds only part of the state.

    A native checkpoint is one process's state: saved from one rank of a job of several, it
    would be registered as a valid checkpoint holding only that rank's part. ``source`` says
    what made the job multi-process: ``runner`` (`ckpt-ha run`'s context), ``launcher``
    (``WORLD_SIZE`` / ``RANK``, e.g. plain torchrun) or ``topology`` (the declared one).
    """

    def __init__(self, rank: int, world_size: int, source: str = "runner") -> None:
        self.rank = rank
        self.world_size = world_size
        self.source = source
        said = {
            "runner": "its runner says",
            "launcher": "$WORLD_SIZE/$RANK say",
            "topology": "the declared topology says",
        }.get(source, source)
        super().__init__(
            f"this job runs {world_size} processes ({said}; this is rank {rank}) and sdk.save "
            "writes one process's state, which would register a checkpoint holding only part "
            "of the job's. "
            "Save with ckpt_ha.sdk.dcp.save on every rank (each writes its own shards, rank 0 "
            "commits once all are durable); or, when rank 0 holds the whole state (DDP "
            "replicas), call sdk.save on rank 0 only, with whole_state=True"
        )


@functools.lru_cache(maxsize=16)
def process_environment(
    frameworks: frozenset[str], image: str | None, libraries: Sequence[str] = ()
) -> RuntimeEnvironment:
    """This process as a checkpoint records it outside a runner: Python, numpy, the frameworks
    the state holds, and the installed versions of ``libraries`` (distribution names, hashable:
    a tuple). Computed once per process and arguments: the versions a save records are those
    the process runs, and looking up an installed distribution's version scans the import path
    (time every save would otherwise add to the training loop's wait)."""
    versions = {"numpy": np.__version__}
    for name in libraries:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    framework: str | None = None
    version: str | None = None
    if "torch" in frameworks:
        from ckpt_ha.sdk import torch_leaves

        framework, version = "torch", torch_leaves.version()
        versions["torch"] = version
    elif "numpy" in frameworks:
        framework, version = "numpy", np.__version__
    return RuntimeEnvironment(
        framework=framework,
        framework_version=version,
        python_version=platform.python_version(),
        image=image,
        libraries=versions,
    )


@dataclass(frozen=True)
class Writer:
    """Who writes a checkpoint: the arguments given, else the runner's context when it is this
    job's, so the checkpoint's identity compares identical with what the runner reported in
    ``job.started`` (`writer_for`). Shared by `save` and `ckpt_ha.sdk.dcp`."""

    job_id: str
    run_id: str
    attempt: int
    code_version: str | None
    topology: Topology | None
    bus: BusEndpoint | None
    environment: RuntimeEnvironment | None
    """The runner's (``job.started``); None outside a runner."""

    def identity(
        self,
        *,
        frameworks: frozenset[str],
        image: str | None,
        created_at: datetime,
        project: str | None = None,
        model_version: str | None = None,
        data_snapshot: str | None = None,
        config_hash: str | None = None,
    ) -> CheckpointIdentity:
        """The runner's environment when there is one (and no ``image`` overrides it), else this
        process's: Python, numpy and the frameworks the state holds."""
        environment = (
            self.environment
            if self.environment is not None and image is None
            else process_environment(frameworks, image)
        )
        return CheckpointIdentity(
            job_id=self.job_id,
            run_id=self.run_id,
            attempt=self.attempt,
            project=project,
            model_version=model_version,
            code_version=self.code_version,
            data_snapshot=data_snapshot,
            config_hash=config_hash,
            environment=environment,
            topology=self.topology,
            created_at=created_at,
        )


def writer_for(
    job_id: str,
    ctx: Context | None,
    *,
    run_id: str | None = None,
    attempt: int | None = None,
    code_version: str | None = None,
    topology: Topology | None = None,
    bus: BusEndpoint | None = None,
) -> Writer:
    """Resolve who writes: explicit arguments first, then ``ctx`` when it is ``job_id``'s."""
    environment = None
    if ctx is not None and ctx.job_id == job_id:
        run_id = run_id if run_id is not None else ctx.run_id
        attempt = attempt if attempt is not None else ctx.attempt
        code_version = code_version if code_version is not None else ctx.code_version
        topology = topology if topology is not None else ctx.topology
        bus = bus if bus is not None else ctx.bus
        environment = ctx.environment
    if run_id is None:
        raise ValueError("run_id is required outside a runner (no $CKPT_HA_JOB for this job)")
    if job_folder(job_id) != job_id:
        raise ValueError(
            f"job id {job_id!r} must be one path component (the job's own folder: no '/', "
            "whitespace, '.' or '..', not a reserved name)"
        )
    return Writer(job_id, run_id, attempt or 1, code_version, topology, bus, environment)


def _put(store: ObjectStore, prefix: str, path: str, data: bytes | memoryview) -> native.Shard:
    """Write one shard and take its checksum on the way: on a filesystem each piece is hashed
    just before the store copies it into the file (`cs.HashingReader`: the bytes cross memory
    once, on the writing thread); elsewhere on a helper thread while the bytes are written."""
    if isinstance(store, FsStore):
        reader = cs.HashingReader(data)
        store.put(join(prefix, path), cast(BinaryIO, reader))
        return native.Shard(path=path, size=len(data), checksum=reader.checksum())
    whole = bytes(data)
    digest = parallel.start([functools.partial(cs.of_bytes, whole)])
    store.put(join(prefix, path), whole)
    [checksum] = digest()
    return native.Shard(path=path, size=len(whole), checksum=checksum)


WRITERS = 2
"""Leaves `save` writes at once: one leaf's fsync waits on the disk while the next is written."""


def _put_leaves(
    store: ObjectStore,
    prefix: str,
    leaves: Sequence[codec.Leaf],
    join_batch: Callable[[], AbstractContextManager[None]] | None,
) -> list[native.Shard]:
    """Write every leaf, `WRITERS` at a time, each a `_put` (its bytes hashed as they are
    written, fsynced); the shards in the leaves' order. A tensor is written from its own memory
    (`codec.Leaf.to_buffer`); any other leaf is serialised just before it is handed to a writer,
    so memory holds at most ``WRITERS + 1`` leaves' copies, never the whole state's. The first
    error is raised once every write started has ended."""
    if len(leaves) <= 1:
        return [_put(store, prefix, leaf.path, leaf.to_buffer()) for leaf in leaves]

    def put(path: str, data: bytes | memoryview) -> native.Shard:
        with join_batch() if join_batch is not None else contextlib.nullcontext():
            return _put(store, prefix, path, data)

    started: list[Future[native.Shard]] = []
    running: set[Future[native.Shard]] = set()
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="ckpt-ha-save") as writers:
        for leaf in leaves:
            if len(running) >= WRITERS:
                ended, running = wait(running, return_when=FIRST_COMPLETED)
                if any(future.exception() is not None for future in ended):
                    break  # a write failed: start no more
            future = writers.submit(put, leaf.path, leaf.to_buffer())
            started.append(future)
            running.add(future)
    return [future.result() for future in started]


def folder_for(job_id: str, step: int, attempt: int = 1) -> str:
    """Where a checkpoint of ``step`` goes: ``<job>/step-<step>``, and for a later attempt of the
    run ``<job>/step-<step>-a<attempt>``. A resumed attempt recomputes steps an earlier attempt
    may have started to save (it was killed mid-write); its checkpoint is a new one, in its own
    folder, never written over the partial one (which the restore-coordinator cleans up)."""
    base = f"{job_id}/step-{step:08d}"
    return base if attempt <= 1 else f"{base}-a{attempt}"


def _world(ctx: Context | None, topology: Topology | None) -> tuple[int, int, str]:
    """This process's rank, the job's world size and who said so (`PartialSave.source`): the
    runner's context, else the launcher's environment; a declared topology (the argument, else
    the runner's) can only make the world larger."""
    if ctx is not None:
        rank, world_size, source = ctx.rank, ctx.world_size, "runner"
    else:
        rank, world_size = launched_as()
        source = "launcher"
    declared = topology if topology is not None else (ctx.topology if ctx is not None else None)
    if declared is not None and declared.world_size > world_size:
        world_size, source = declared.world_size, "topology"
    return rank, world_size, source


@marks.during("save")
def save(
    storage_root: str | ObjectStore,
    job_id: str,
    step: int,
    state: Mapping[str, object],
    *,
    run_id: str | None = None,
    attempt: int | None = None,
    project: str | None = None,
    model_version: str | None = None,
    code_version: str | None = None,
    data_snapshot: str | None = None,
    config_hash: str | None = None,
    topology: Topology | None = None,
    image: str | None = None,
    exact_resume: bool = True,
    bus: BusEndpoint | None = None,
    clock: Clock = utc_now,
    ctx: Context | None = None,
    whole_state: bool = False,
) -> Saved:
    """Write ``state`` as checkpoint ``<job_id>/step-<step:08d>`` and announce it (best effort).

    ``state`` maps names to a tree of mappings, lists, tuples, JSON scalars and array leaves
    (bytes, numpy arrays, torch tensors): e.g. ``{"model": model.state_dict(), "optimizer":
    optimizer.state_dict(), "epoch": 3}``. Unsupported leaves raise `UnsupportedState` before
    anything is written; a folder that already holds files raises `CheckpointExists`. Tensors
    are written from their own memory: leave the state unchanged until `save` returns (as a
    training loop that calls it does).

    Under a runner (`context()`, or ``ctx``), ``run_id``, ``attempt``, ``code_version``,
    ``topology``, ``bus`` and the runtime environment default to the attempt's, so the
    checkpoint's identity matches what the runner reported in ``job.started``.

    In a multi-process job one process holds only part of the state: `PartialSave` is raised,
    except on rank 0 when the caller says its state is the whole job's (``whole_state=True``,
    e.g. DDP replicas; the manifest then says so). The job is multi-process when its runner
    says so, when the launcher does (``WORLD_SIZE`` > 1: plain torchrun), or when the declared
    ``topology`` (or the runner's) has a world size above 1. Save each rank's part with
    `ckpt_ha.sdk.dcp.save`.
    """
    ctx = ctx if ctx is not None else context()
    rank, world_size, source = _world(ctx, topology)
    if world_size > 1 and (rank != 0 or not whole_state):
        raise PartialSave(rank, world_size, source)
    writer = writer_for(
        job_id,
        ctx,
        run_id=run_id,
        attempt=attempt,
        code_version=code_version,
        topology=topology,
        bus=bus,
    )
    run_id, bus = writer.run_id, writer.bus
    if step < 0:
        raise ValueError(f"step {step} must be >= 0")
    store = open_store(storage_root) if isinstance(storage_root, str) else storage_root
    prefix = folder_for(job_id, step, writer.attempt)
    uri = store.uri(prefix)
    encoded = codec.encode(state)
    now = clock()
    identity = writer.identity(
        frameworks=encoded.frameworks,
        image=image,
        created_at=now,
        project=project,
        model_version=model_version,
        data_snapshot=data_snapshot,
        config_hash=config_hash,
    )
    if next(iter(store.list(f"{prefix}/")), None) is not None:
        raise CheckpointExists(uri)

    # The index is the folder's first file: its mtime, as the store lists it, fixes the id.
    shards = [_put(store, prefix, INDEX, encoded.index)]
    checkpoint_id = checkpoint_id_on(store, prefix)
    writing = CheckpointWritingV1(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        uri=uri,
        run_id=run_id,
        step=step,
        format=CheckpointFormat.NATIVE,
    )
    trace = trace_context()  # one trace for the checkpoint: writing, committed and what follows
    announced_writing = try_announce(bus, writing, now, traceparent=trace)
    # On a filesystem the folder's entries are fsynced once, before the manifest vouches for them.
    fs = store if isinstance(store, FsStore) else None
    with fs.folder_fsyncs_batched() if fs is not None else contextlib.nullcontext() as join_batch:
        shards.extend(_put_leaves(store, prefix, encoded.leaves, join_batch))
    manifest = native.Manifest(
        step=step,
        created_at=now,
        identity=identity,
        exact_resume=exact_resume,
        shards=tuple(shards),
        whole_state=True if world_size > 1 else None,
    )
    store.put_if_absent(join(prefix, native.MANIFEST), manifest.dump())
    final_id = checkpoint_id_on(store, prefix)
    if final_id != checkpoint_id:  # a leaf listed older than the index: the clock stepped back
        log.warning("checkpoint id moved from %s to %s while saving", checkpoint_id, final_id)
        checkpoint_id = final_id  # what the watcher derives from the finished folder
    committed = CheckpointCommittedV1(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        uri=uri,
        run_id=run_id,
        step=step,
        format=CheckpointFormat.NATIVE,
        identity=identity,
        shard_count=len(shards),
        total_bytes=sum(s.size for s in shards),
    )
    announced = try_announce(bus, committed, clock(), traceparent=trace)
    return Saved(checkpoint_id, uri, step, manifest, announced, announced_writing)


def load(where: str | ObjectStore, prefix: str = "", *, tensors: Tensors = "auto") -> Loaded:
    """Read the checkpoint at ``where`` (its folder URI or path, e.g. `Saved.uri` or a registry
    record's ``uri``; or a store plus ``prefix``), verifying every shard as it is read.

    Torch tensors come back as torch tensors when torch is installed (``tensors="numpy"``
    forces numpy arrays); numpy arrays as numpy, bytes as bytes, the rest as saved. Raises
    `CheckpointUnreadable` for a missing manifest or any size/checksum mismatch, and
    `NeedsTorch` for a tensor dtype numpy cannot hold (bfloat16, float8) without torch.
    """
    store = open_store(where) if isinstance(where, str) else where
    uri = store.uri(join(prefix, native.MANIFEST)).removesuffix(f"/{native.MANIFEST}")
    try:
        manifest = native.Manifest.model_validate_json(
            store.read_bytes(join(prefix, native.MANIFEST))
        )
    except ObjectNotFound as exc:
        raise CheckpointUnreadable(uri, "incomplete", f"{native.MANIFEST} is missing") from exc
    except ValidationError as exc:
        raise CheckpointUnreadable(uri, "corrupt", f"{native.MANIFEST}: {exc}") from exc
    listed = {shard.path: shard for shard in manifest.shards}

    def read(path: str) -> bytes:
        shard = listed.get(path)
        if shard is None or inside(path) != path:
            raise CheckpointUnreadable(uri, "corrupt", f"{path!r} is not a shard of the manifest")
        try:
            data = store.read_bytes(join(prefix, path))
            algorithm, _ = cs.parse(shard.checksum)
        except ObjectNotFound as exc:
            raise CheckpointUnreadable(uri, "corrupt", f"{path} is missing") from exc
        except ValueError as exc:
            raise CheckpointUnreadable(uri, "corrupt", f"{path}: {exc}") from exc
        if len(data) != shard.size:
            reason = f"{path}: {len(data)} bytes, manifest says {shard.size}"
            raise CheckpointUnreadable(uri, "corrupt", reason)
        if cs.of_bytes(data, algorithm) != shard.checksum:
            raise CheckpointUnreadable(uri, "corrupt", f"{path}: checksum mismatch")
        return data

    try:
        if INDEX in listed:
            state = codec.decode(read(INDEX), read, tensors=tensors)
        else:  # written by native.write directly, or by an SDK before the state index
            state = codec.decode_plain({path: read(path) for path in listed})
    except NeedsTorch:
        raise  # the checkpoint is fine; this process cannot represent it
    except UnreadableState as exc:
        raise CheckpointUnreadable(uri, "corrupt", str(exc)) from exc
    return Loaded(state=state, step=manifest.step, uri=uri, manifest=manifest)
