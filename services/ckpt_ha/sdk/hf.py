"""Hugging Face `Trainer` integration (the ``hf`` extra): checkpoints ckpt-ha can prove complete
and bind to their job, progress reports, and a resume through the Trainer's own loader.

Use it with your training code::

    from ckpt_ha.sdk import hf

    args = TrainingArguments(output_dir=hf.output_dir(), save_steps=500, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[hf.CkptHaCallback()])
    hf.train(trainer)  # a fresh start, or the restore the runner planned

``output_dir()`` is ``<storage root>/<job>``: ckpt-ha watches ``<root>/<job>/<folder>/``, so the
Trainer's ``checkpoint-<step>`` folders are seen only there.

A save, with `CkptHaCallback` (``formats/sidecar.py`` has the rules it follows):

1. The Trainer decides to save (``DefaultFlowCallback`` sets ``control.should_save`` in
   ``on_step_end``, or ``on_epoch_end`` for ``save_strategy="epoch"``; callbacks run after it).
   Process zero writes the intent (``ckpt-ha.identity.json``) into ``checkpoint-<step>/`` as the
   folder's first file, then announces ``checkpoint.writing``. A folder of that name left over
   from an earlier attempt (a save that was killed, then recomputed after a resume) is removed
   first: the Trainer would write over it anyway, and the new checkpoint must get its own id.
2. The Trainer writes its files into the existing folder (it creates it with ``exist_ok``).
3. ``on_save`` (after the Trainer wrote ``trainer_state.json``): every process waits for the
   others, then process zero hands the commit to a thread of its own and training goes on:
   it fsyncs and checksums every file (files, and a large file's chunks, side by side on
   several threads), writes the commit (``ckpt-ha.commit.json``) and announces
   ``checkpoint.committed``. Reading the files back for their checksums is cheap (they are in
   the page cache); the fsync, which the Trainer alone does not do, is what takes time, and the
   training loop no longer waits for it. The next save (before its intent, and before the
   Trainer rotates older folders) and the end of training wait for the commit; a crash before
   it leaves the folder uncommitted, as a crash during the save would.

``save_strategy="best"`` decides to save after evaluating, when no callback can run before the
write: such folders get no sidecars (they are plain Trainer folders to ckpt-ha).
``save_total_limit`` works: the folders the Trainer rotates away are recorded as deleted by
their writer (the writer-watcher's tombstone, the job as actor), never as damage, and no plan
names them afterwards. The Trainer rotates inside its save, after writing the new folder and
before ``on_save``, and offers no hook in between; so with a limit of 1 it deletes the last
committed checkpoint before ckpt-ha can commit the new one, and a crash in that window finds
no valid checkpoint. Use a limit of 2 or more (the callback warns at 1). Never use
``resume_from_checkpoint=True`` either: the Trainer then takes the highest-numbered folder, even
a half-written one.

A resume: `resume_from_checkpoint` (for code that calls ``trainer.train`` itself) verifies the
plan's folder (`formats.verify`, its checkpoint id, its step), then hands it to
``Trainer.train(resume_from_checkpoint=...)``. `train` checks the checkpoint id first and runs
the rest of that verification beside the Trainer's load (one read of the files, not two in
turn): the callback waits for it in ``on_train_begin``, before any step. The callback reports
``resume.loaded`` in ``on_train_begin``, when the Trainer has loaded weights, optimizer,
scheduler and ``trainer_state.json`` (the RNG state follows when the first epoch starts). A
failure to verify or load reports ``resume.load_failed`` and raises `ResumeFailed`. In a
multi-process job every process verifies the folder before its Trainer trains on it.

The data position reported (progress, commit, ``resume.loaded``) is the samples seen: step x
per-device batch x gradient accumulation x world size.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import TrainOutput

from ckpt_ha import formats
from ckpt_ha.contracts.bounds import MAX_METRICS, MAX_NAME
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointWritingV1,
    FailureSide,
    Topology,
)
from ckpt_ha.contracts.resume import LoadBlame, ResumeMode, ResumePlannedV2
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.core.locations import job_folder
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import hf_trainer, parallel, sidecar
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.checkpoints import CheckpointUnreadable, process_environment
from ckpt_ha.sdk.progress import progress
from ckpt_ha.sdk.protocol import Context, context, trace_context, try_announce
from ckpt_ha.sdk.resuming import (
    LOADERS,
    ResumeFailed,
    UnsupportedFormat,
    classify_failure,
    report_load_failed,
    report_loaded,
    waiting_for_storage,
)
from ckpt_ha.storage import FsStore
from ckpt_ha.storage.fs_store import fsync

TORCH = frozenset({"torch"})
"""What a Trainer checkpoint holds: torch state (the environment records torch's version)."""
log = logging.getLogger("ckpt_ha.sdk")

HF = CheckpointFormat.HF_TRAINER
LOADER = "ckpt_ha.sdk.hf"

MATH_ARGUMENTS = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "optim", "optim_args", "lr_scheduler_type", "lr_scheduler_kwargs",
    "warmup_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
    "num_train_epochs", "seed", "data_seed", "bf16", "fp16", "label_smoothing_factor",
    "average_tokens_across_devices",
)  # fmt: skip
"""The training arguments in the config hash: what changes the numbers a step computes (the
optimizer and its schedule, the batch each step sees, the seeds, the precision). Output paths,
logging, saving and evaluation settings are not in it; the world size is the topology's."""

VOLATILE_CONFIG = frozenset(
    {"transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype"}
)
"""Model-config keys left out of the config hash: the library version (the environment records
it), where the model was loaded from, and what ``save_pretrained`` fills in on the first save
(``architectures``, the dtype), which would change the hash between two checkpoints of one run.
The dtype the parameters really have is hashed instead."""


class NotResumable(Exception):
    """The plan asks for an exact resume of a folder that holds weights only: the checkpoint is
    what it says it is (valid as weights), so this blames the plan's attempt, not the checkpoint."""


def output_dir(
    ctx: Context | None = None, *, root: str | None = None, job: str | None = None
) -> str:
    """``<storage root>/<job>``: where the Trainer's ``output_dir`` must point for ckpt-ha to see
    its checkpoints. Root and job come from the runner (``ctx`` or `context()`) unless given."""
    ctx = ctx if ctx is not None else context()
    root = root if root is not None else (ctx.storage_root if ctx is not None else None)
    job = job if job is not None else (ctx.job_id if ctx is not None else None)
    if root is None or job is None:
        raise ValueError(
            "no storage root or job: outside a runner (no $CKPT_HA_STORAGE_ROOT / $CKPT_HA_JOB) "
            "pass root= and job= explicitly"
        )
    if job_folder(job) != job:
        raise ValueError(
            f"job id {job!r} must be one path component (the job's own folder: no '/', "
            "whitespace, '.' or '..', not a reserved name)"
        )
    return str(_local(root) / job)


def _local(uri_or_path: str) -> Path:
    """The local folder a ``file://`` URI or a path names; the Trainer reads and writes only
    local (or mounted) folders."""
    parts = urlsplit(uri_or_path)
    if parts.scheme == "":
        return Path(uri_or_path)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(unquote(parts.path))
    raise ValueError(
        f"{uri_or_path} is not a local folder: the Trainer reads and writes checkpoints on a "
        "filesystem, so the storage root must be a path or a file:// URI (a mounted volume)"
    )


def config_hash(model: object, args: TrainingArguments) -> str:
    """``sha256:<hex>`` of the model config (without `VOLATILE_CONFIG`), the parameters' dtype
    and `MATH_ARGUMENTS`."""
    config = getattr(model, "config", None)
    described = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    doc = {
        "model": {k: v for k, v in described.items() if k not in VOLATILE_CONFIG},
        "dtype": str(getattr(model, "dtype", None)),
        "training": {name: getattr(args, name, None) for name in MATH_ARGUMENTS},
    }
    canonical = json.dumps(doc, sort_keys=True, default=str)
    return f"sha256:{hashlib.sha256(canonical.encode()).hexdigest()}"


def samples_seen(args: TrainingArguments, state: TrainerState, step: int) -> int:
    """The data position at ``step``: step x per-device batch x gradient accumulation x world
    size. Counts samples the steps were given; a short last batch of an epoch counts as full."""
    batch = state.train_batch_size or args.per_device_train_batch_size
    return int(step * batch * args.gradient_accumulation_steps * args.world_size)


def _saves_under(args: TrainingArguments) -> Path:
    """The folder the Trainer writes ``checkpoint-<step>`` folders into (absolute)."""
    if args.output_dir is None:  # TrainingArguments fills in a default; never None in a run
        raise ValueError("TrainingArguments.output_dir is not set: use hf.output_dir()")
    return Path(args.output_dir).resolve()


def _barrier(args: TrainingArguments) -> None:
    """Wait for every process of the job (nothing to wait for in a single process)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if args.world_size > 1 and distributed:
        torch.distributed.barrier()


@dataclass(frozen=True)
class _Writing:
    """A checkpoint whose intent is written and whose commit is not yet."""

    step: int
    prefix: str
    checkpoint_id: str
    identity: CheckpointIdentity
    trace: str


_verifying_since: dict[str, float] = {}
"""Plan id → when `resume_from_checkpoint` began, for ``resume.loaded``'s ``load_seconds``."""
_verifying: dict[str, Callable[[], object]] = {}
"""By plan id: the join of a verification `train` started beside the Trainer's load; the
callback takes it in ``on_train_begin``, before any step (and before the RNG state loads)."""


def _verified_by_now(ctx: Context, plan: ResumePlannedV2) -> None:
    """Wait for the verification `train` started for ``plan`` (if any); a failure is reported
    and raised as `ResumeFailed`."""
    join = _verifying.pop(plan.plan_id, None)
    if join is None:
        return
    try:
        join()
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        report_load_failed(ctx, plan, reason, *classify_failure(exc))
        raise ResumeFailed(plan, reason) from exc


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
        _verified_by_now(ctx, plan)  # the files were read for their checksums meanwhile
        self.resumed = True
        if state.is_world_process_zero:
            started = _verifying_since.pop(plan.plan_id, None)
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
            if _saves_under(args) != expected:
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
        _barrier(args)

    def _write_intent(
        self, args: TrainingArguments, state: TrainerState, model: object, ctx: Context
    ) -> _Writing:
        out = _saves_under(args)
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
        _barrier(args)  # every process's files (its rng_state_<rank>.pth) are written
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
        store = FsStore(_saves_under(args).parent)
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


# --- resuming ------------------------------------------------------------------------------


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
    _verifying_since[plan.plan_id] = time.monotonic()
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
    path = _local(plan.checkpoint_uri.rstrip("/"))
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


def _start_verifying(ctx: Context, plan: ResumePlannedV2) -> str:
    """`resume_from_checkpoint`, its reading of the files overlapped with the Trainer's load:
    the folder's checkpoint id is checked now (the Trainer never loads a replaced folder), the
    rest of the verification (`formats.verify`, step, exact resume) starts on the verification
    pool, and the callback waits for it in ``on_train_begin``. The Trainer loads everything it
    reads before then with ``torch.load(weights_only=True)`` or safetensors, which run no code."""
    _verifying_since[plan.plan_id] = time.monotonic()
    try:
        folder = waiting_for_storage(plan, lambda: _same_checkpoint(plan))
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        report_load_failed(ctx, plan, reason, *classify_failure(exc))
        raise ResumeFailed(plan, reason) from exc
    # The Trainer's own torch.load(weights_only=True) is the trial load: not done twice.
    verify = functools.partial(
        waiting_for_storage, plan, lambda: _verified_folder(plan, trial_load=False)
    )
    _verifying[plan.plan_id] = parallel.start([verify])
    return str(folder)


def _loadable(ctx: Context, plan: ResumePlannedV2) -> None:
    """After the Trainer failed to load a folder that passed verification without the trial
    load: the whole verification, trial load included, so that a file torch cannot load
    blames the checkpoint as it did before the load (reported and raised as `ResumeFailed`)."""
    try:
        _verified_folder(plan)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        report_load_failed(ctx, plan, reason, *classify_failure(exc))
        raise ResumeFailed(plan, reason) from exc


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
    folder = _start_verifying(ctx, plan)
    try:
        return trainer.train(resume_from_checkpoint=folder)
    except ResumeFailed:
        raise
    except Exception as exc:
        if callback.resumed:
            raise  # training failed after the load: the runner reports job.failed
        _verified_by_now(ctx, plan)  # a damaged file explains a failed load: it is reported
        _loadable(ctx, plan)  # so does a file torch cannot load: the trial load, run now
        reason = f"the Trainer could not load {folder}: {exc or type(exc).__name__}"
        rank = trainer.args.process_index if trainer.args.world_size > 1 else None
        report_load_failed(ctx, plan, reason, *classify_failure(exc), rank=rank)
        raise ResumeFailed(plan, reason) from exc
