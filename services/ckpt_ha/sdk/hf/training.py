"""`train`: ``trainer.train()`` for this attempt, a fresh start or a resume from the plan's
verified folder through the Trainer's own loader."""

from __future__ import annotations

from transformers import Trainer
from transformers.trainer_utils import TrainOutput

from ckpt_ha.sdk.hf.callback import CkptHaCallback
from ckpt_ha.sdk.hf.verifying import loadable, verified_for_load
from ckpt_ha.sdk.protocol import Context, context
from ckpt_ha.sdk.resuming import ResumeFailed, classify_failure, report_load_failed


def train(trainer: Trainer, *, ctx: Context | None = None) -> TrainOutput:
    """``trainer.train()`` for this attempt: a fresh start without a plan, else a resume from the
    plan's verified folder through the Trainer's own loader.

    Adds a `CkptHaCallback` when the Trainer has none. If verification or the Trainer's loading
    fails (before ``resume.loaded``), publishes ``resume.load_failed`` — blaming the checkpoint
    only when its bytes failed their checks (`classify_failure`) — and raises `ResumeFailed`.
    """
    ctx = ctx if ctx is not None else context()
    if ctx is None:
        return trainer.train()
    callback = next(
        (cb for cb in trainer.callback_handler.callbacks if isinstance(cb, CkptHaCallback)), None
    )
    if callback is None:
        callback = CkptHaCallback(ctx=ctx)
        trainer.add_callback(callback)
    elif callback.ctx is None:  # made where no runner context was found: give it this one
        callback.ctx = ctx
    plan = ctx.plan
    if plan is None:
        return trainer.train()
    folder = verified_for_load(ctx, plan)
    try:
        return trainer.train(resume_from_checkpoint=folder)
    except ResumeFailed:
        raise
    except Exception as exc:
        if callback.resumed:
            raise  # training failed after the load: the runner reports job.failed
        loadable(ctx, plan)  # a file torch cannot load explains it: the trial load, run now
        reason = f"the Trainer could not load {folder}: {exc or type(exc).__name__}"
        rank = trainer.args.process_index if trainer.args.world_size > 1 else None
        report_load_failed(ctx, plan, reason, *classify_failure(exc), rank=rank)
        raise ResumeFailed(plan, reason) from exc
