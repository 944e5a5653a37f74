"""The rows of ``bench_overhead.py`` that need a resume plan or a Trainer: a restore
(``dcp.resume``, ``hf.train``) against a raw read plus the framework's own load of the same
checkpoint, and a Trainer's save with ``CkptHaCallback`` against the same Trainer's without.

The Trainer is a GPT-2 built from a config in code (no weights downloaded) on synthetic tokens,
sized so that its checkpoint (weights, AdamW's two moments, the rest) is about the asked size.
The runner's context comes from a plain environment: no bus (nothing is announced), the plan a
restore-coordinator would publish for the checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from transformers import (
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.lab.examples.hf_gpt2 import TokenData, gpt2_config
from ckpt_ha.sdk import dcp, hf, protocol
from ckpt_ha.storage import FsStore

Timed = Callable[[Callable[[], object]], float]


def context(root: Path, job: str, plan: ResumePlannedV2 | None = None) -> sdk.Context:
    env = {
        protocol.JOB: job,
        protocol.RUN_ID: "run-2" if plan is not None else "run-1",
        protocol.ATTEMPT: "2" if plan is not None else "1",
        protocol.STORAGE_ROOT: str(root),
    }
    if plan is not None:
        env[protocol.RESUME_PLAN] = plan.model_dump_json()
    ctx = sdk.context(env)
    assert ctx is not None
    return ctx


def plan_for(
    root: Path, job: str, folder: str, step: int, fmt: CheckpointFormat
) -> ResumePlannedV2:
    """The plan a restore-coordinator would publish for ``<root>/<job>/<folder>``."""
    store = FsStore(root)
    prefix = f"{job}/{folder}"
    return ResumePlannedV2(
        job_id=job,
        plan_id=f"plan-{uuid.uuid4().hex[:12]}",
        failed_run_id="run-1",
        attempt=2,
        checkpoint_id=checkpoint_id_on(store, prefix),
        checkpoint_uri=store.uri(prefix),
        step=step,
        mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL,
        expected_step=step,
        checkpoint_format=fmt.value,
    )


def zeroed(state: dict[str, Any]) -> dict[str, Any]:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0}


def dcp_restore(
    root: Path, state: dict[str, Any], rounds: int, timed: Timed, read: Callable[[Path], int]
) -> tuple[list[float], list[float]]:
    """Rounds of (a raw read of the folder + ``dcp.load`` from it) and of ``dcp.resume`` of the
    same committed checkpoint, in turn which goes first; each loads into its own zeroed copy."""
    root.mkdir(parents=True, exist_ok=True)
    saved = dcp.save(state, step=1, job_id="restore", storage_root=str(root), run_id="run-1")
    folder = Path(saved.uri.removeprefix("file://"))
    plan = plan_for(root, "restore", folder.name, 1, CheckpointFormat.TORCH_DCP)
    ctx = context(root, "restore", plan)
    plain: list[float] = []
    ours: list[float] = []
    for n in range(rounds):
        target_plain, target_ours = zeroed(state), zeroed(state)

        def plain_load(t: dict[str, Any] = target_plain) -> None:
            read(folder)
            dcp_load(t, storage_reader=FileSystemReader(folder), no_dist=True)

        def resume(t: dict[str, Any] = target_ours) -> None:
            resumed = dcp.resume(t, ctx=ctx)
            assert resumed is not None
            assert resumed.checksums_verified

        sides = [(plain, plain_load), (ours, resume)]
        for into, fn in sides if n % 2 == 0 else reversed(sides):
            into.append(timed(fn))
        assert torch.equal(target_ours["model"]["layer0.weight"], state["model"]["layer0.weight"])
    shutil.rmtree(folder)
    return plain, ours


# -- the Trainer ---------------------------------------------------------------------------------


class _SaveStarts(TrainerCallback):
    """The first callback: notes when the Trainer decides to save (``on_step_end``, before
    ``CkptHaCallback`` writes its intent)."""

    def __init__(self, times: list[float]) -> None:
        self.times = times

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if control.should_save:
            self.times.append(-time.perf_counter())


class _SaveEnds(TrainerCallback):
    """The last callback: notes when the save is over (``on_save``, after ``CkptHaCallback``
    committed)."""

    def __init__(self, times: list[float]) -> None:
        self.times = times

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        self.times[-1] += time.perf_counter()


class _Loaded(Exception):
    """Raised by `_StopWhenLoaded`: the Trainer has loaded the checkpoint, nothing to train."""


class _StopWhenLoaded(TrainerCallback):
    """The last callback: stops the Trainer in ``on_train_begin``, once it loaded weights,
    optimizer and scheduler (and ``CkptHaCallback`` saw the verification through)."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        raise _Loaded


def _trainer(out: Path, mb: int, steps: int, callbacks: list[TrainerCallback]) -> Trainer:
    """A GPT-2 whose checkpoint is about ``mb`` MB: weights plus AdamW's two moments are three
    copies of 12 n_embd^2 floats a layer (n_embd 512: 12.6 MB a layer, 38 MB saved)."""
    torch.manual_seed(0)
    config = gpt2_config(n_layer=max(1, round(mb / 38)), n_head=8, n_embd=512)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=1,
        per_device_train_batch_size=2,
        learning_rate=1e-4,
        seed=0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
    )
    return Trainer(
        model=GPT2LMHeadModel(config), args=args, train_dataset=TokenData(8), callbacks=callbacks
    )


def trainer_save(root: Path, mb: int, rounds: int) -> tuple[list[float], list[float], float]:
    """Rounds of one Trainer step and its save, without and with ``CkptHaCallback`` in turn;
    the time from the Trainer's decision to save to the end of its save (ckpt-ha's intent,
    fsyncs, checksums and commit included). Also the checkpoint's size in GB. Each round starts
    with nothing left to write back (``os.sync``, untimed): the plain Trainer never syncs, and
    its folder's writeback and removal would otherwise land in the next round's first fsync."""
    root.mkdir(parents=True, exist_ok=True)
    plain: list[float] = []
    ours: list[float] = []
    size = 0.0
    for n in range(rounds):
        for with_ckpt_ha in (False, True) if n % 2 == 0 else (True, False):
            times = ours if with_ckpt_ha else plain
            job = f"trainer-{n}-{int(with_ckpt_ha)}"
            ctx = context(root, job)
            middle: list[TrainerCallback] = [hf.CkptHaCallback(ctx=ctx)] if with_ckpt_ha else []
            trainer = _trainer(root / job, mb, 1, [_SaveStarts(times), *middle, _SaveEnds(times)])
            os.sync()  # as a save minutes after the last one finds it: nothing left to write back
            trainer.train()
            folder = root / job / "checkpoint-1"
            size = sum(p.stat().st_size for p in folder.iterdir()) / 1e9
            shutil.rmtree(root / job)
    return plain, ours, size


def trainer_checkpoint(root: Path, mb: int) -> Path:
    """A Trainer checkpoint of about ``mb`` MB committed by ``CkptHaCallback`` (its folder)."""
    root.mkdir(parents=True, exist_ok=True)
    job = "trainer-checkpoint"
    _trainer(root / job, mb, 1, [hf.CkptHaCallback(ctx=context(root, job))]).train()
    return root / job / "checkpoint-1"


def hf_restore(
    root: Path, mb: int, rounds: int, timed: Timed, read: Callable[[Path], int]
) -> tuple[list[float], list[float]]:
    """Rounds of (a raw read of a committed Trainer checkpoint + ``trainer.train`` resuming from
    it) and of ``hf.train`` with the plan for it, in turn, each until the Trainer has loaded it
    (``on_train_begin``; the RNG state, loaded as the first epoch starts, is left out of both);
    each Trainer is built beforehand."""
    root.mkdir(parents=True, exist_ok=True)
    job = "hf-restore"
    ctx = context(root, job)
    _trainer(root / job, mb, 1, [hf.CkptHaCallback(ctx=ctx)]).train()
    folder = root / job / "checkpoint-1"
    plan = plan_for(root, job, folder.name, 1, CheckpointFormat.HF_TRAINER)
    resuming = context(root, job, plan)
    plain: list[float] = []
    ours: list[float] = []
    for n in range(rounds):
        plain_trainer = _trainer(root / "hf-plain", mb, 1, [_StopWhenLoaded()])
        callbacks = [hf.CkptHaCallback(ctx=resuming), _StopWhenLoaded()]
        ours_trainer = _trainer(root / job, mb, 1, callbacks)

        def plain_load(t: Trainer = plain_trainer) -> None:
            read(folder)
            with contextlib.suppress(_Loaded):
                t.train(resume_from_checkpoint=str(folder))

        def verified_load(t: Trainer = ours_trainer) -> None:
            with contextlib.suppress(_Loaded):
                hf.train(t, ctx=resuming)

        sides = [(plain, plain_load), (ours, verified_load)]
        for into, fn in sides if n % 2 == 0 else reversed(sides):
            into.append(timed(fn))
    shutil.rmtree(root / job)
    shutil.rmtree(root / "hf-plain", ignore_errors=True)
    return plain, ours
