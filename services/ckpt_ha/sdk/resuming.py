"""Resume a job from the restore-coordinator's plan: load the planned checkpoint (waiting a
while for storage that is briefly gone) and report `resume.loaded` or `resume.load_failed`.

A load failure says what it is evidence against (`classify_failure`, R7): only the checkpoint's
bytes failing their checks blame the checkpoint (the coordinator quarantines it and plans the
one before); a loader that does not support the format, a missing dependency, an environment
error or storage that stayed unreachable blame this attempt and leave the checkpoint valid.
`report_loaded` / `report_load_failed` are shared by every loader (native here, DCP in
`ckpt_ha.sdk.dcp`, the Trainer in `ckpt_ha.sdk.hf`)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ckpt_ha.contracts.checkpoint import CheckpointFormat, FailureSide
from ckpt_ha.contracts.resume import (
    LoadBlame,
    ResumeLoadedV1,
    ResumeLoadFailedV2,
    ResumePlannedV2,
)
from ckpt_ha.core.clock import utc_now
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.checkpoints import CheckpointUnreadable, Loaded, load
from ckpt_ha.sdk.protocol import Context, context, try_announce
from ckpt_ha.sdk.state import NeedsTorch, Tensors
from ckpt_ha.storage import ObjectNotFound, ObjectStore, StorageError, open_store

log = logging.getLogger("ckpt_ha.sdk")
T = TypeVar("T")


class ResumeFailed(Exception):
    """The plan's checkpoint could not be verified or loaded: this attempt must not train on.

    ``resume.load_failed`` has been published (best effort): the restore-coordinator
    quarantines the checkpoint and plans the previous valid one when the failure blames the
    checkpoint, and keeps it when it blames the attempt.
    """

    def __init__(self, plan: ResumePlannedV2, reason: str) -> None:
        self.plan = plan
        self.reason = reason
        super().__init__(
            f"cannot resume from checkpoint {plan.checkpoint_id} ({plan.checkpoint_uri}) "
            f"planned by {plan.plan_id}: {reason}"
        )


class UnsupportedFormat(Exception):
    """This loader cannot read the plan's checkpoint format: evidence against the attempt (it
    used the wrong loader), never against the checkpoint."""

    def __init__(self, fmt: str | None, loader: str, use: str) -> None:
        self.format = fmt
        super().__init__(
            f"the planned checkpoint is format {fmt or 'unknown'}, which {loader} does not "
            f"read: use {use}"
        )


LOADERS: Mapping[str, str] = {
    CheckpointFormat.NATIVE.value: "ckpt_ha.sdk.resume()",
    CheckpointFormat.TORCH_DCP.value: "ckpt_ha.sdk.dcp.resume()",
    CheckpointFormat.HF_TRAINER.value: "ckpt_ha.sdk.hf (the Trainer's resume_from_checkpoint)",
}
"""Which SDK entry point loads each restorable format (what an `UnsupportedFormat` advises)."""


def classify_failure(exc: BaseException) -> tuple[LoadBlame, FailureSide]:
    """What a load failure is evidence against, and who has to act (R2, R7).

    The checkpoint is blamed only when its own bytes failed their checks or are gone
    (`CheckpointUnreadable`, an object not found): the platform lost or damaged them. An
    unsupported format, a missing dependency, storage that stayed unreachable and any other
    error in the loading code blame the attempt.
    """
    if isinstance(exc, (CheckpointUnreadable, ObjectNotFound)):
        return LoadBlame.CHECKPOINT, FailureSide.INFRASTRUCTURE
    if isinstance(exc, StorageError):
        return LoadBlame.ATTEMPT, FailureSide.INFRASTRUCTURE
    return LoadBlame.ATTEMPT, FailureSide.JOB


def report_load_failed(
    ctx: Context,
    plan: ResumePlannedV2,
    reason: str,
    blame: LoadBlame,
    side: FailureSide,
    *,
    rank: int | None = None,
) -> None:
    """Publish ``resume.load_failed`` for the plan (once per plan: its event id is the plan's)."""
    failed = ResumeLoadFailedV2(
        job_id=ctx.job_id,
        plan_id=plan.plan_id,
        run_id=ctx.run_id,
        checkpoint_id=plan.checkpoint_id,
        reason=reason[:2000],
        side=side,
        blame=blame,
        rank=rank,
    )
    try_announce(ctx.bus, failed, utc_now(), f"resume.load_failed|{plan.plan_id}", always=True)


def report_loaded(
    ctx: Context,
    plan: ResumePlannedV2,
    *,
    step: int,
    seconds: float,
    data_position: int | None = None,
    rng_fingerprint: str | None = None,
    world_size: int | None = None,
    written_world_size: int | None = None,
) -> None:
    """Publish ``resume.loaded`` for the plan (once per plan); ``written_world_size`` only when
    it differs from ``world_size`` (a resharded load)."""
    loaded_event = ResumeLoadedV1(
        job_id=ctx.job_id,
        plan_id=plan.plan_id,
        run_id=ctx.run_id,
        checkpoint_id=plan.checkpoint_id,
        step=step,
        attempt=ctx.attempt,
        data_position=data_position,
        rng_fingerprint=rng_fingerprint,
        load_seconds=round(seconds, 6),
        world_size=world_size,
        written_world_size=written_world_size if written_world_size != world_size else None,
    )
    try_announce(ctx.bus, loaded_event, utc_now(), f"resume.loaded|{plan.plan_id}", always=True)


@dataclass(frozen=True)
class Resumed:
    """A checkpoint restored for a plan: the state to continue from, and the plan itself."""

    plan: ResumePlannedV2
    loaded: Loaded

    @property
    def state(self) -> dict[str, Any]:
        return self.loaded.state

    @property
    def step(self) -> int:
        return self.loaded.step


Describe = Callable[[Mapping[str, Any]], tuple[int | None, str | None]]
"""From a restored state: (data position, RNG fingerprint), reported in ``resume.loaded``."""


@marks.during("load")
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
        loaded = waiting_for_storage(plan, lambda: _load_planned(plan, ctx, tensors))
        data_position, rng = describe(loaded.state) if describe is not None else (None, None)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, NeedsTorch):
            reason = f"{reason} (this attempt's environment cannot load it)"
        blame, side = classify_failure(exc)
        report_load_failed(ctx, plan, reason, blame, side)
        raise ResumeFailed(plan, reason) from exc
    report_loaded(
        ctx,
        plan,
        step=loaded.step,
        seconds=time.monotonic() - started,
        data_position=data_position,
        rng_fingerprint=rng,
    )
    return Resumed(plan, loaded)


RESTORE_STORAGE_WAIT_S = 60.0
"""Default for ``CKPT_HA_RESTORE_STORAGE_WAIT_S``: how long a restore waits for storage that is
unavailable (a transient `StorageError`: volume unmounted, endpoint down) before it fails."""


def waiting_for_storage(plan: ResumePlannedV2, attempt: Callable[[], T]) -> T:
    """``attempt()`` (a load or a verification of the plan's checkpoint), retried with backoff
    while storage is unavailable, within the limit of ``CKPT_HA_RESTORE_STORAGE_WAIT_S``.
    Anything else (a checksum mismatch, a missing shard) fails at once: waiting cannot repair a
    damaged checkpoint."""
    limit = float(os.environ.get("CKPT_HA_RESTORE_STORAGE_WAIT_S", RESTORE_STORAGE_WAIT_S))
    deadline = time.monotonic() + limit
    delay = 0.2
    tries = 1
    while True:
        try:
            return attempt()
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


@dataclass(frozen=True)
class PlannedFolder:
    """Where a plan's checkpoint is: a store and the folder's key in it."""

    store: ObjectStore
    prefix: str
    """The folder's key in ``store``; "" when the store is rooted at the folder itself."""
    uri: str
    under_root: bool
    """True when the folder is a key of the runner's storage root: its checkpoint id can then be
    derived and compared with the plan's (`check_planned`)."""


def locate(plan: ResumePlannedV2, ctx: Context) -> PlannedFolder:
    """The plan's folder under the runner's storage root when it is there, else a store opened
    on the plan's URI (rooted at the folder)."""
    uri = plan.checkpoint_uri.rstrip("/")
    folder = "/".join(uri.split("/")[-2:])
    if ctx.storage_root is not None:
        candidate = open_store(ctx.storage_root)
        with contextlib.suppress(ValueError):  # not a key of this store: open it by URI
            if candidate.uri(folder) == uri:
                return PlannedFolder(candidate, folder, uri, under_root=True)
    return PlannedFolder(open_store(uri), "", uri, under_root=False)


def check_planned(where: PlannedFolder, plan: ResumePlannedV2, step: int | None) -> None:
    """The folder still holds the planned checkpoint (its id, when it can be derived) at the
    planned step (when the checkpoint records one); `CheckpointUnreadable` otherwise."""
    if where.under_root:
        found = checkpoint_id_on(where.store, where.prefix)
        if found != plan.checkpoint_id:
            reason = f"the folder now holds checkpoint {found}, not the planned one"
            raise CheckpointUnreadable(where.uri, "replaced", reason)
    if step is not None and step != plan.step:
        raise CheckpointUnreadable(
            where.uri, "mismatch", f"the checkpoint says step {step}, the plan {plan.step}"
        )


def _load_planned(plan: ResumePlannedV2, ctx: Context, tensors: Tensors) -> Loaded:
    fmt = plan.checkpoint_format
    if fmt is not None and fmt != CheckpointFormat.NATIVE.value:
        raise UnsupportedFormat(fmt, "ckpt_ha.sdk.resume()", LOADERS.get(fmt, "its framework"))
    where = locate(plan, ctx)
    loaded = load(where.store, where.prefix, tensors=tensors)
    check_planned(where, plan, loaded.step)
    return loaded
