"""`CkptHaCallback`: the intent and commit sidecars beside each Trainer save, progress reports,
the slow-phase marks and ``resume.loaded`` (see the package doc)."""

from __future__ import annotations

import functools
import itertools
import logging
import math
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ckpt_ha.contracts.bounds import MAX_METRICS, MAX_NAME
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointIdentity,
    CheckpointWritingV1,
    FailureSide,
    Topology,
)
from ckpt_ha.contracts.resume import LoadBlame
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import hf_trainer, parallel, sidecar
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.checkpoints import process_environment
from ckpt_ha.sdk.hf.job import (
    HF,
    TORCH,
    barrier,
    config_hash,
    output_dir,
    samples_seen,
    saves_under,
)
from ckpt_ha.sdk.hf.verifying import verifying_since
from ckpt_ha.sdk.progress import progress
from ckpt_ha.sdk.protocol import Context, context, trace_context, try_announce
from ckpt_ha.sdk.resuming import ResumeFailed, report_load_failed, report_loaded
from ckpt_ha.storage import FsStore
from ckpt_ha.storage.fs_store import fsync

log = logging.getLogger("ckpt_ha.sdk")


@dataclass(frozen=True)
class _Writing:
    """A checkpoint whose intent is written and whose commit is not yet."""

    step: int
    prefix: str
    checkpoint_id: str
    identity: CheckpointIdentity
    trace: str


class CkptHaCallback(TrainerCallback):
    """Writes the intent and commit sidecars beside each Trainer save, announces them, reports
    progress on each log, and reports ``resume.loaded`` when the Trainer has loaded the plan's
    checkpoint. Add it to every process of the job; process zero does the writing and reporting.

    Outside a runner (no context) it does nothing: a checkpoint needs a job and a run to be bound
    to. ``project``, ``model_version`` and ``data_snapshot`` go into every checkpoint's identity.
    """

    def __init__(
        self,
        *,
        ctx: Context | None = None,
        project: str | None = None,
        model_version: str | None = None,
        data_snapshot: str | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.ctx = ctx if ctx is not None else context()
        self.project = project
        self.model_version = model_version
        self.data_snapshot = data_snapshot
        self.clock = clock
        self.resumed = False
        """True once ``resume.loaded`` was reported for this attempt's plan."""
        self._writing: _Writing | None = None
        self._committer: ThreadPoolExecutor | None = None
        self._committing: Future[None] | None = None
        """Process zero's commit of the last save, written while training goes on."""
        if self.ctx is None:
            log.info("no ckpt-ha runner context: CkptHaCallback records nothing")

    # --- the training run ----------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        if state.is_world_process_zero:
            self._warn_about(args, ctx)
        plan = ctx.plan
        if plan is None or self.resumed:
            return
        if state.global_step != plan.step:
            reason = (
                f"the Trainer starts at step {state.global_step}, the plan restores step "
                f"{plan.step}: pass resume_from_checkpoint=hf.resume_from_checkpoint() to "
                "trainer.train, or call hf.train(trainer)"
            )
            rank = args.process_index if args.world_size > 1 else None
            report_load_failed(ctx, plan, reason, LoadBlame.ATTEMPT, FailureSide.JOB, rank=rank)
            raise ResumeFailed(plan, reason)
        self.resumed = True
        if state.is_world_process_zero:
            started = verifying_since.pop(plan.plan_id, None)
            report_loaded(
                ctx,
                plan,
                step=state.global_step,
                seconds=time.monotonic() - started if started is not None else 0.0,
                data_position=samples_seen(args, state, state.global_step),
            )

    def _warn_about(self, args: TrainingArguments, ctx: Context) -> None:
        try:
            expected = Path(output_dir(ctx)).resolve()
        except ValueError as exc:  # no storage root, or one the Trainer cannot write to
            log.warning("ckpt-ha will not see this Trainer's checkpoints: %s", exc)
        else:
            if saves_under(args) != expected:
                log.warning(
                    "the Trainer saves under %s, ckpt-ha watches %s: set "
                    "TrainingArguments(output_dir=hf.output_dir())", args.output_dir, expected,
                )  # fmt: skip
        if args.save_total_limit == 1:
            log.warning(
                "save_total_limit=1: the Trainer deletes the previous checkpoint inside its save, "
                "before ckpt-ha commits the new one, so a crash then finds no valid checkpoint; "
                "use save_total_limit >= 2"
            )
        if args.save_strategy == "best":
            log.warning(
                "save_strategy='best' saves without notice: those checkpoints get no ckpt-ha "
                "identity or commit file"
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        if self.ctx is None or not state.is_world_process_zero:
            return
        # What a report can carry (finite numbers, bounded names and count): a Trainer's logs
        # are not ours to refuse, so the rest is left out rather than failing the step.
        metrics = dict(itertools.islice((
            (name, float(value))
            for name, value in (logs or {}).items()
            if isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and len(name) <= MAX_NAME
        ), MAX_METRICS))  # fmt: skip
        step = state.global_step
        progress(step, data_position=samples_seen(args, state, step), metrics=metrics, ctx=self.ctx)

    # --- a save ------------------------------------------------------------------------------

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._slow_phases(control)
        self._before_save(args, state, control, kw.get("model"))

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._slow_phases(control)
        self._before_save(args, state, control, kw.get("model"))

    # --- slow phases: what the runner's hang detection does not count ------------------------

    def _slow_phases(self, control: TrainerControl) -> None:
        """The Trainer evaluates and saves right after this step (its flow callback, which
        runs first, decided): mark the phases until `on_evaluate` / `on_save` (or the next
        step, should either never come)."""
        if self.ctx is None:
            return
        if control.should_evaluate:
            marks.enter("eval", self.ctx)
        if control.should_save:
            marks.enter("save", self.ctx)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if self.ctx is not None:
            marks.leave("eval", self.ctx)
            marks.leave("save", self.ctx)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if self.ctx is not None:
            marks.leave("eval", self.ctx)

    def _before_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: object
    ) -> None:
        """The Trainer saves next: the intent first, before any process writes into the folder."""
        if self.ctx is None or not control.should_save:
            return
        if state.is_world_process_zero:
            self._committed()  # the last save's commit first: before any rotation, any intent
            pending = self._writing
            if pending is None or pending.step != state.global_step:
                self._writing = self._write_intent(args, state, model, self.ctx)
        barrier(args)

    def _write_intent(
        self, args: TrainingArguments, state: TrainerState, model: object, ctx: Context
    ) -> _Writing:
        out = saves_under(args)
        store = FsStore(out.parent)
        step = state.global_step
        prefix = f"{out.name}/checkpoint-{step}"
        folder = store.root / prefix
        if folder.exists():
            log.warning(
                "%s already exists (a save of an earlier attempt): removing it before the "
                "Trainer writes this step again", folder,
            )  # fmt: skip
            shutil.rmtree(folder, ignore_errors=True)
        now = self.clock()
        identity = CheckpointIdentity(
            job_id=ctx.job_id,
            run_id=ctx.run_id,
            attempt=ctx.attempt,
            project=self.project,
            model_version=self.model_version,
            code_version=ctx.code_version,
            data_snapshot=self.data_snapshot,
            config_hash=config_hash(model, args),
            environment=(
                ctx.environment
                if ctx.environment is not None
                else process_environment(TORCH, None, ("transformers", "accelerate"))
            ),
            topology=(
                ctx.topology if ctx.topology is not None else Topology(world_size=args.world_size)
            ),
            created_at=now,
        )
        intent = sidecar.Intent(
            identity=identity, format=HF.value, step=step, world_size=args.world_size
        )
        sidecar.write_intent(store, prefix, intent)
        writing = _Writing(step, prefix, checkpoint_id_on(store, prefix), identity, trace_context())
        announcement = CheckpointWritingV1(
            job_id=ctx.job_id,
            checkpoint_id=writing.checkpoint_id,
            uri=store.uri(prefix),
            run_id=ctx.run_id,
            step=step,
            format=HF,
        )
        try_announce(ctx.bus, announcement, now, traceparent=writing.trace)
        return writing

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """The Trainer has written the folder, ``trainer_state.json`` last: commit it (the
        save's slow phase ends once the commit is written)."""
        if self.ctx is None:
            return
        try:
            self._after_save(args, state)
        finally:
            marks.leave("save", self.ctx)

    def _after_save(self, args: TrainingArguments, state: TrainerState) -> None:
        assert self.ctx is not None
        barrier(args)  # every process's files (its rng_state_<rank>.pth) are written
        if not state.is_world_process_zero:
            return
        writing, self._writing = self._writing, None
        if writing is None or writing.step != state.global_step:
            log.warning(
                "checkpoint-%d was saved without an intent written first (save_strategy "
                "'best'?): ckpt-ha writes no commit for it", state.global_step,
            )  # fmt: skip
            return
        position = samples_seen(args, state, writing.step)
        if self._committer is None:  # its thread is joined at exit: a commit is never cut short
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="ckpt-ha-hf-commit")
        self._committing = self._committer.submit(self._commit, args, writing, self.ctx, position)

    def _committed(self) -> None:
        """Wait for the commit of the last save (its error, if any, is raised here)."""
        committing, self._committing = self._committing, None
        if committing is not None:
            committing.result()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        self._committed()  # train() returns with every checkpoint it saved committed

    def _commit(
        self, args: TrainingArguments, writing: _Writing, ctx: Context, data_position: int
    ) -> None:
        store = FsStore(saves_under(args).parent)
        base = f"{writing.prefix}/"
        names = [info.key[len(base) :] for info in list(store.list(base))]
        names = [name for name in names if name not in sidecar.NAMES]

        def evidence(name: str) -> sidecar.FileEvidence:
            fsync(store.root / base / name)  # durable before the commit that vouches for it
            digest, size = cs.checksum(store, base + name, cs.WRITE_ALGORITHM)
            return sidecar.FileEvidence(size=size, checksum=digest)

        # Files side by side (and a large file's chunks): their fsyncs and reads overlap.
        found = parallel.run([functools.partial(evidence, name) for name in names])
        files = dict(zip(names, found, strict=True))
        rng = (
            {"rng_state.pth"}
            if args.world_size <= 1
            else {f"rng_state_{rank}.pth" for rank in range(args.world_size)}
        )
        commit = sidecar.Commit(
            step=writing.step,
            files=files,
            exact_resume=all(name in files for name in (*hf_trainer.RESUME_STATE, *rng)),
            data_position=data_position,
        )
        sidecar.write_commit(store, writing.prefix, commit)
        checkpoint_id = checkpoint_id_on(store, writing.prefix)
        if checkpoint_id != writing.checkpoint_id:  # a file listed older than the intent
            log.warning(
                "checkpoint id moved from %s to %s while saving", writing.checkpoint_id,
                checkpoint_id,
            )  # fmt: skip
        committed = CheckpointCommittedV1(
            job_id=ctx.job_id,
            checkpoint_id=checkpoint_id,
            uri=store.uri(writing.prefix),
            run_id=ctx.run_id,
            step=writing.step,
            format=HF,
            identity=writing.identity,
            shard_count=len(files),
            total_bytes=sum(f.size for f in files.values()),
        )
        try_announce(ctx.bus, committed, self.clock(), traceparent=writing.trace)
