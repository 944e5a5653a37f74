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

`load()` reads a checkpoint back, checking each shard's size and checksum against the manifest
as it reads, and rebuilds the state (torch tensors when torch is installed, numpy otherwise).
Nothing is pickled either way.

`progress()` reports a training step without waiting for the bus: one background publisher per
bus and process sends the reports over one connection (`ckpt_ha.sdk.publisher`).

Importing the SDK loads no server-side library (faststream, redis, boto3, OpenTelemetry, ...):
boto3 is imported when an ``s3://`` root is opened, OpenTelemetry only if the training code uses
it already.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointWritingV1,
    FailureSide,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import JobProgressV1
from ckpt_ha.contracts.resume import ResumeLoadedV1, ResumeLoadFailedV1, ResumePlannedV1
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import native
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.sdk import publisher as background
from ckpt_ha.sdk import state as codec
from ckpt_ha.sdk.protocol import BadContext, Bus, Context, context, trace_context, try_announce
from ckpt_ha.sdk.publisher import PublisherStats
from ckpt_ha.sdk.state import INDEX, NeedsTorch, Tensors, UnreadableState, UnsupportedState
from ckpt_ha.storage import ObjectNotFound, ObjectStore, StorageError, open_store

__all__ = [
    "INDEX",
    "BadContext",
    "Bus",
    "CheckpointExists",
    "CheckpointUnreadable",
    "Context",
    "Loaded",
    "NeedsTorch",
    "PublisherStats",
    "ResumeFailed",
    "Resumed",
    "Saved",
    "UnsupportedState",
    "context",
    "fingerprint",
    "flush_progress",
    "load",
    "progress",
    "progress_stats",
    "resume",
    "save",
]

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


def _environment(frameworks: frozenset[str], image: str | None) -> RuntimeEnvironment:
    libraries = {"numpy": np.__version__}
    framework: str | None = None
    version: str | None = None
    if "torch" in frameworks:
        from ckpt_ha.sdk import torch_leaves

        framework, version = "torch", torch_leaves.version()
        libraries["torch"] = version
    elif "numpy" in frameworks:
        framework, version = "numpy", np.__version__
    return RuntimeEnvironment(
        framework=framework,
        framework_version=version,
        python_version=platform.python_version(),
        image=image,
        libraries=libraries,
    )


def _put(store: ObjectStore, prefix: str, path: str, data: bytes) -> native.Shard:
    store.put(join(prefix, path), data)
    return native.Shard(path=path, size=len(data), checksum=cs.of_bytes(data))


def folder_for(job_id: str, step: int, attempt: int = 1) -> str:
    """Where a checkpoint of ``step`` goes: ``<job>/step-<step>``, and for a later attempt of the
    run ``<job>/step-<step>-a<attempt>``. A resumed attempt recomputes steps an earlier attempt
    may have started to save (it was killed mid-write); its checkpoint is a new one, in its own
    folder, never written over the partial one (which the restore-coordinator cleans up)."""
    base = f"{job_id}/step-{step:08d}"
    return base if attempt <= 1 else f"{base}-a{attempt}"


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
    bus: Bus | None = None,
    clock: Clock = utc_now,
    ctx: Context | None = None,
) -> Saved:
    """Write ``state`` as checkpoint ``<job_id>/step-<step:08d>`` and announce it (best effort).

    ``state`` maps names to a tree of mappings, lists, tuples, JSON scalars and array leaves
    (bytes, numpy arrays, torch tensors): e.g. ``{"model": model.state_dict(), "optimizer":
    optimizer.state_dict(), "epoch": 3}``. Unsupported leaves raise `UnsupportedState` before
    anything is written; a folder that already holds files raises `CheckpointExists`.

    Under a runner (`context()`, or ``ctx``), ``run_id``, ``attempt``, ``code_version``,
    ``topology``, ``bus`` and the runtime environment default to the attempt's, so the
    checkpoint's identity matches what the runner reported in ``job.started``.
    """
    ctx = ctx if ctx is not None else context()
    if ctx is not None and ctx.job_id == job_id:
        run_id = run_id if run_id is not None else ctx.run_id
        attempt = attempt if attempt is not None else ctx.attempt
        code_version = code_version if code_version is not None else ctx.code_version
        topology = topology if topology is not None else ctx.topology
        bus = bus if bus is not None else ctx.bus
    if run_id is None:
        raise ValueError("run_id is required outside a runner (no $CKPT_HA_JOB for this job)")
    if inside(job_id) != job_id or "/" in job_id:
        raise ValueError(f"job id {job_id!r} must be one path component")
    if step < 0:
        raise ValueError(f"step {step} must be >= 0")
    store = open_store(storage_root) if isinstance(storage_root, str) else storage_root
    prefix = folder_for(job_id, step, attempt or 1)
    uri = store.uri(prefix)
    encoded = codec.encode(state)
    now = clock()
    identity = CheckpointIdentity(
        job_id=job_id,
        run_id=run_id,
        attempt=attempt or 1,
        project=project,
        model_version=model_version,
        code_version=code_version,
        data_snapshot=data_snapshot,
        config_hash=config_hash,
        environment=(
            ctx.environment
            if ctx is not None and ctx.job_id == job_id and ctx.environment and image is None
            else _environment(encoded.frameworks, image)
        ),
        topology=topology,
        created_at=now,
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
    # One leaf serialised at a time: memory holds one shard's bytes, not the whole state.
    shards.extend(_put(store, prefix, leaf.path, leaf.to_bytes()) for leaf in encoded.leaves)
    manifest = native.Manifest(
        step=step,
        created_at=now,
        identity=identity,
        exact_resume=exact_resume,
        shards=tuple(shards),
    )
    store.put_if_absent(join(prefix, native.MANIFEST), manifest.model_dump_json(indent=2).encode())
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


class ResumeFailed(Exception):
    """The plan's checkpoint could not be verified or loaded: this attempt must not train on.

    ``resume.load_failed`` has been published (best effort), so the restore-coordinator
    quarantines the checkpoint and plans the previous valid one.
    """

    def __init__(self, plan: ResumePlannedV1, reason: str) -> None:
        self.plan = plan
        self.reason = reason
        super().__init__(
            f"cannot resume from checkpoint {plan.checkpoint_id} ({plan.checkpoint_uri}) "
            f"planned by {plan.plan_id}: {reason}"
        )


@dataclass(frozen=True)
class Resumed:
    """A checkpoint restored for a plan: the state to continue from, and the plan itself."""

    plan: ResumePlannedV1
    loaded: Loaded

    @property
    def state(self) -> dict[str, Any]:
        return self.loaded.state

    @property
    def step(self) -> int:
        return self.loaded.step


Describe = Callable[[Mapping[str, Any]], tuple[int | None, str | None]]
"""From a restored state: (data position, RNG fingerprint), reported in ``resume.loaded``."""


def resume(
    *,
    describe: Describe | None = None,
    tensors: Tensors = "auto",
    ctx: Context | None = None,
) -> Resumed | None:
    """Carry out this attempt's resume plan: None on a fresh start (no plan).

    With a plan: load its checkpoint, verifying every shard (`load`), its step and its id
    against the plan; publish ``resume.loaded`` (with the data position and RNG fingerprint
    ``describe`` gives) and return the state. If anything does not match or cannot be read,
    publish ``resume.load_failed`` and raise `ResumeFailed`: never train on from a checkpoint
    that is not the verified one.
    """
    ctx = ctx if ctx is not None else context()
    if ctx is None or ctx.plan is None:
        return None
    plan = ctx.plan
    started = time.monotonic()
    try:
        loaded = _load_waiting_for_storage(plan, ctx, tensors)
        data_position, rng = describe(loaded.state) if describe is not None else (None, None)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        infrastructure = isinstance(exc, CheckpointUnreadable) or (
            isinstance(exc, StorageError) and exc.transient
        )
        side = FailureSide.INFRASTRUCTURE if infrastructure else FailureSide.JOB
        failed = ResumeLoadFailedV1(
            job_id=ctx.job_id,
            plan_id=plan.plan_id,
            run_id=ctx.run_id,
            checkpoint_id=plan.checkpoint_id,
            reason=reason[:2000],
            side=side,
        )
        try_announce(ctx.bus, failed, utc_now(), f"resume.load_failed|{plan.plan_id}", always=True)
        raise ResumeFailed(plan, reason) from exc
    loaded_event = ResumeLoadedV1(
        job_id=ctx.job_id,
        plan_id=plan.plan_id,
        run_id=ctx.run_id,
        checkpoint_id=plan.checkpoint_id,
        step=loaded.step,
        attempt=ctx.attempt,
        data_position=data_position,
        rng_fingerprint=rng,
        load_seconds=round(time.monotonic() - started, 6),
    )
    try_announce(ctx.bus, loaded_event, utc_now(), f"resume.loaded|{plan.plan_id}", always=True)
    return Resumed(plan, loaded)


RESTORE_STORAGE_WAIT_S = 60.0
"""Default for ``CKPT_HA_RESTORE_STORAGE_WAIT_S``: how long a restore waits for storage that is
unavailable (a transient `StorageError`: volume unmounted, endpoint down) before it fails."""


def _load_waiting_for_storage(plan: ResumePlannedV1, ctx: Context, tensors: Tensors) -> Loaded:
    """`_load_planned`, retried with backoff while storage is unavailable, within the limit of
    ``CKPT_HA_RESTORE_STORAGE_WAIT_S``. Anything else (a checksum mismatch, a missing shard) fails
    at once: waiting cannot repair a damaged checkpoint."""
    limit = float(os.environ.get("CKPT_HA_RESTORE_STORAGE_WAIT_S", RESTORE_STORAGE_WAIT_S))
    deadline = time.monotonic() + limit
    delay = 0.2
    tries = 1
    while True:
        try:
            return _load_planned(plan, ctx, tensors)
        except StorageError as exc:
            if not exc.transient or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "storage unavailable while loading %s (try %d), retrying in %.1fs: %s",
                plan.checkpoint_id, tries, delay, exc,
            )  # fmt: skip
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            tries += 1


def _load_planned(plan: ResumePlannedV1, ctx: Context, tensors: Tensors) -> Loaded:
    store: ObjectStore | None = None
    folder = "/".join(plan.checkpoint_uri.rstrip("/").split("/")[-2:])
    if ctx.storage_root is not None:
        candidate = open_store(ctx.storage_root)
        with contextlib.suppress(ValueError):  # not a key of this store: load by URI
            if candidate.uri(folder) == plan.checkpoint_uri.rstrip("/"):
                store = candidate
    if store is None:
        loaded = load(plan.checkpoint_uri, tensors=tensors)
    else:
        loaded = load(store, folder, tensors=tensors)
        found = checkpoint_id_on(store, folder)
        if found != plan.checkpoint_id:
            raise CheckpointUnreadable(
                loaded.uri,
                "replaced",
                f"the folder now holds checkpoint {found}, not the planned one",
            )
    if loaded.step != plan.step:
        raise CheckpointUnreadable(
            loaded.uri, "mismatch", f"its manifest says step {loaded.step}, the plan {plan.step}"
        )
    return loaded


def progress(
    step: int,
    *,
    data_position: int | None = None,
    rng_fingerprint: str | None = None,
    metrics: Mapping[str, float] | None = None,
    ctx: Context | None = None,
) -> bool:
    """Report one training step (``job.progress``; with the plan id on a resumed attempt).

    Never waits for the bus: the report is queued for this process's background publisher
    (one connection per bus, opened on the first report) and sent from there; when the queue
    is full the oldest queued report is dropped, counted (`progress_stats`) and reported in the
    next published one. Also writes the step to the runner's progress file, so a failure report
    carries the last step even when the bus is down.

    Returns whether the report was queued without pushing an older one out: False outside a
    runner (nothing is reported), without a bus, or when the queue was full.
    """
    ctx = ctx if ctx is not None else context()
    if ctx is None:
        return False
    if ctx.progress_file is not None:
        _write_progress(ctx.progress_file, step)
    if ctx.bus is None:
        return False
    event = JobProgressV1(
        job_id=ctx.job_id,
        run_id=ctx.run_id,
        attempt=ctx.attempt,
        step=step,
        data_position=data_position,
        rng_fingerprint=rng_fingerprint,
        metrics={k: float(v) for k, v in (metrics or {}).items()},
        plan_id=ctx.plan.plan_id if ctx.plan is not None else None,
    )
    key = f"job.progress|{ctx.job_id}|{ctx.run_id}|{ctx.attempt}|{step}"
    return background.publisher_for(ctx.bus).submit(event, utc_now(), key)


def progress_stats(bus: Bus | None = None) -> PublisherStats | None:
    """What the progress publisher of ``bus`` (default: this attempt's) has published, dropped
    and still holds; None when it has not been used in this process."""
    if bus is None:
        ctx = context()
        bus = ctx.bus if ctx is not None else None
    return background.stats_for(bus) if bus is not None else None


def flush_progress(timeout_s: float = 5.0) -> bool:
    """Wait up to ``timeout_s`` until the queued progress reports are published (True if all
    were). Runs at exit by itself; returns at once while the bus is known to be down."""
    return background.flush_all(timeout_s)


def _write_progress(path: str, step: int) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as out:
            out.write(f"{step}\n")
        os.replace(tmp, path)  # atomic: the runner never reads half a number
    except OSError as exc:
        log.warning("cannot write the progress file %s: %r", path, exc)


def fingerprint(value: object) -> str:
    """A short, stable digest of an RNG state (or any JSON/array tree), for ``rng_fingerprint``.

    numpy arrays and bytes are hashed by dtype, shape and content; everything else as canonical
    JSON (dict keys sorted), so the same state always gives the same fingerprint.
    """
    digest = hashlib.sha256()

    def feed(v: object) -> None:
        if isinstance(v, np.ndarray):
            digest.update(f"nd:{v.dtype.str}:{v.shape}:".encode())
            digest.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, bytes | bytearray):
            digest.update(b"b:" + bytes(v))
        elif isinstance(v, Mapping):
            digest.update(b"{")
            for k in sorted(v, key=str):
                digest.update(json.dumps(str(k)).encode() + b":")
                feed(v[k])
            digest.update(b"}")
        elif isinstance(v, list | tuple):
            digest.update(b"[")
            for item in v:
                feed(item)
                digest.update(b",")
            digest.update(b"]")
        elif hasattr(v, "numpy") and hasattr(v, "detach"):  # a torch tensor
            feed(v.detach().cpu().numpy())
        else:
            digest.update(json.dumps(v, sort_keys=True, default=str).encode())

    feed(value)
    return digest.hexdigest()[:16]
