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
``Trainer.train(resume_from_checkpoint=...)``. `train` does the same, leaving the trial load to
the Trainer's own ``torch.load(weights_only=True)`` (run again by ckpt-ha only when the
Trainer's load fails, to say whether the file is to blame). The callback reports
``resume.loaded`` in ``on_train_begin``, when the Trainer has loaded weights, optimizer,
scheduler and ``trainer_state.json`` (the RNG state follows when the first epoch starts). A
failure to verify or load reports ``resume.load_failed`` and raises `ResumeFailed`. In a
multi-process job every process verifies the folder before its Trainer trains on it.

The data position reported (progress, commit, ``resume.loaded``) is the samples seen: step x
per-device batch x gradient accumulation x world size.

Its parts: `callback` (`CkptHaCallback`), `verifying` (`resume_from_checkpoint` and the checks
before the Trainer's load), `training` (`train`), `job` (the job's folder, config hash, data
position); import them all from here.
"""

from ckpt_ha.sdk.hf.callback import CkptHaCallback
from ckpt_ha.sdk.hf.job import (
    HF,
    LOADER,
    MATH_ARGUMENTS,
    TORCH,
    VOLATILE_CONFIG,
    config_hash,
    output_dir,
    samples_seen,
)
from ckpt_ha.sdk.hf.training import train
from ckpt_ha.sdk.hf.verifying import NotResumable, resume_from_checkpoint

__all__ = [
    "HF",
    "LOADER",
    "MATH_ARGUMENTS",
    "TORCH",
    "VOLATILE_CONFIG",
    "CkptHaCallback",
    "NotResumable",
    "config_hash",
    "output_dir",
    "resume_from_checkpoint",
    "samples_seen",
    "train",
]
