"""A resume's checks before the Trainer's load: the plan's folder still holds the planned
checkpoint, verifies, is at the planned step and (for an exact resume) holds more than weights;
failures are reported as ``resume.load_failed`` and raised as `ResumeFailed`."""

from __future__ import annotations

import time
from pathlib import Path

from ckpt_ha import formats
from ckpt_ha.contracts.resume import ResumeMode, ResumePlannedV2
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.sdk.checkpoints import CheckpointUnreadable
from ckpt_ha.sdk.hf.job import HF, LOADER, local_folder
from ckpt_ha.sdk.protocol import Context, context
from ckpt_ha.sdk.resuming import (
    LOADERS,
    ResumeFailed,
    UnsupportedFormat,
    classify_failure,
    report_load_failed,
    waiting_for_storage,
)
from ckpt_ha.storage import FsStore


class NotResumable(Exception):
    """The plan asks for an exact resume of a folder that holds weights only: the checkpoint is
    what it says it is (valid as weights), so this blames the plan's attempt, not the checkpoint."""


verifying_since: dict[str, float] = {}
"""Plan id → when `resume_from_checkpoint` began, for ``resume.loaded``'s ``load_seconds``."""


def resume_from_checkpoint(ctx: Context | None = None) -> str | None:
    """The folder to give ``trainer.train(resume_from_checkpoint=...)``: None on a fresh start
    (no plan), else the plan's folder once verified.

    For training code that calls ``trainer.train`` itself (with `CkptHaCallback` added, which
    reports ``resume.loaded``)::

        trainer.train(resume_from_checkpoint=hf.resume_from_checkpoint())

    When the folder is gone, replaced (another checkpoint id), not a complete Trainer folder, at
    another step than planned, or weights only for an exact resume: publishes
    ``resume.load_failed`` and raises `ResumeFailed`. A failure of the Trainer's own loading is
    reported only by `train`.
    """
    ctx = ctx if ctx is not None else context()
    if ctx is None or ctx.plan is None:
        return None
    plan = ctx.plan
    verifying_since[plan.plan_id] = time.monotonic()
    try:
        return str(waiting_for_storage(plan, lambda: _verified_folder(plan)))
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        report_load_failed(ctx, plan, reason, *classify_failure(exc))
        raise ResumeFailed(plan, reason) from exc


def _same_checkpoint(plan: ResumePlannedV2) -> Path:
    """The plan's folder, when it is of the Trainer's format and still holds the planned
    checkpoint (its id): what is checked before the Trainer may read it."""
    fmt = plan.checkpoint_format
    if fmt is not None and fmt != HF.value:
        raise UnsupportedFormat(fmt, LOADER, LOADERS.get(fmt, "its framework"))
    path = local_folder(plan.checkpoint_uri.rstrip("/"))
    store = FsStore(path.parent.parent)  # the storage root: the id is derived from <job>/<name>
    prefix = f"{path.parent.name}/{path.name}"
    uri = plan.checkpoint_uri
    if next(iter(store.list(f"{prefix}/")), None) is None:  # a missing root raises, transient
        raise CheckpointUnreadable(uri, "missing", "the folder is gone")
    found = checkpoint_id_on(store, prefix)
    if found != plan.checkpoint_id:
        raise CheckpointUnreadable(
            uri, "replaced", f"the folder now holds checkpoint {found}, not the planned one"
        )
    return path


def _verified_folder(plan: ResumePlannedV2, *, trial_load: bool = True) -> Path:
    fmt = plan.checkpoint_format
    path = _same_checkpoint(plan)
    store = FsStore(path.parent.parent)
    prefix = f"{path.parent.name}/{path.name}"
    uri = plan.checkpoint_uri
    report = formats.verify(store, prefix, trial_load=trial_load)
    if not report.ok:
        raise CheckpointUnreadable(uri, report.verdict.value, "; ".join(report.reasons))
    if report.format is not HF:
        if fmt is None and report.format.value in LOADERS:  # another restorable format
            raise UnsupportedFormat(report.format.value, LOADER, LOADERS[report.format.value])
        raise CheckpointUnreadable(
            uri, "incomplete", f"not a complete Trainer folder (it reads as {report.format})"
        )
    if report.step != plan.step:
        raise CheckpointUnreadable(
            uri, "mismatch", f"trainer_state.json says step {report.step}, the plan {plan.step}"
        )
    if plan.mode is ResumeMode.EXACT and not report.exact_resume:
        raise NotResumable(
            f"{uri} holds weights only (no optimizer/scheduler state): not an exact resume"
        )
    return path


def verified_for_load(ctx: Context, plan: ResumePlannedV2) -> str:
    """`resume_from_checkpoint` for `train`: the plan's folder verified, all of it, before the
    Trainer loads it, except the trial load: the Trainer's own ``torch.load(weights_only=True)``
    is that, not done twice (`loadable` runs it when the Trainer's load fails).

    Before, then the load; never beside it. On two cores, the checksums read beside the load
    slowed the load by more than they took alone (the hashing threads and the load's Python
    take turns at the GIL, and share the memory bus): raw read + Trainer load / ``hf.train``
    was 0.78-0.90 at 300 MB and 0.80-0.86 at 2 GB beside it, 0.95-1.06 and 0.99-1.06 before it
    (2026-12-04, idle, 5-7 rounds each, alternated). The load then reads files the
    verification just brought into the page cache."""
    verifying_since[plan.plan_id] = time.monotonic()
    try:
        folder = waiting_for_storage(plan, lambda: _verified_folder(plan, trial_load=False))
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        report_load_failed(ctx, plan, reason, *classify_failure(exc))
        raise ResumeFailed(plan, reason) from exc
    return str(folder)


def loadable(ctx: Context, plan: ResumePlannedV2) -> None:
    """After the Trainer failed to load a folder that passed verification without the trial
    load: the whole verification, trial load included, so that a file torch cannot load
    blames the checkpoint as it did before the load (reported and raised as `ResumeFailed`)."""
    try:
        _verified_folder(plan)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        report_load_failed(ctx, plan, reason, *classify_failure(exc))
        raise ResumeFailed(plan, reason) from exc
