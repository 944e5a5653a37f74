"""A real Hugging Face `Trainer` on CPU, small enough for tests: a 2-layer GPT-2 built from a
config in code and synthetic tokens made in code (nothing is downloaded), deterministic for a
fixed seed (dropout included: the Trainer saves and restores the RNG state).

Run as a module, it is a training process under a runner (the ``CKPT_HA_*`` environment) that
stops to sleep right after ckpt-ha wrote the intent of the checkpoint at ``pause_step``: a test
SIGKILLs it there, as a job killed while saving::

    python -m tests.support.hf_tools <output_dir> <pause_step>
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from transformers import (
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from ckpt_ha.lab.examples.hf_gpt2 import TokenData, gpt2_config
from ckpt_ha.sdk import hf

MAX_STEPS, SAVE_STEPS, BATCH = 6, 2, 4


def tiny_trainer(
    output_dir: str, callbacks: list[TrainerCallback] | None = None, *, n_embd: int = 32
) -> Trainer:
    """A Trainer of `MAX_STEPS` steps saving every `SAVE_STEPS`, logging every step.

    One intra-op thread, in the test process and in a child trainer alike: float sums split
    over another number of threads round differently, and the tests compare weights bit for
    bit across the two (an earlier test in the same process may also have set one thread)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = gpt2_config(n_embd=n_embd)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=MAX_STEPS,
        save_steps=SAVE_STEPS,
        logging_steps=1,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        seed=0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
    )
    return Trainer(
        model=GPT2LMHeadModel(config), args=args, train_dataset=TokenData(64), callbacks=callbacks
    )


class PauseAfterIntent(TrainerCallback):
    """Sleeps in ``on_step_end`` of ``step``: after `hf.CkptHaCallback` (added before it) wrote
    the intent, before the Trainer writes anything."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if state.global_step == self.step and control.should_save:
            time.sleep(120)


if __name__ == "__main__":
    out, pause = sys.argv[1], int(sys.argv[2])
    hf.train(tiny_trainer(out, [hf.CkptHaCallback(), PauseAfterIntent(pause)]))
