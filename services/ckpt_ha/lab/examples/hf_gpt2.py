"""A Hugging Face `Trainer` job under ckpt-ha: a 2-layer GPT-2 built from a config in code,
trained on synthetic tokens made in code (nothing is downloaded), resumable bit for bit.

The integration is three lines of the training script (`ckpt_ha.sdk.hf`): ``output_dir`` from
the runner, `hf.CkptHaCallback` among the callbacks, `hf.train` instead of ``trainer.train``.
Every step is printed as one JSON line on stdout (``{"step": s, "loss": float.hex(loss),
"attempt": a}``), what the drills plot.

    ckpt-ha run --job gpt2 -- python -m ckpt_ha.lab.examples.hf_gpt2 --steps 40 --save-steps 10

``--slow-save S`` makes every save pause S seconds after the weights are written and before the
optimizer state is (drills kill the job right there: a Trainer killed mid-save).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from ckpt_ha import sdk
from ckpt_ha.lab.examples import print_loss
from ckpt_ha.sdk import hf

SEQUENCES, LENGTH, VOCAB = 256, 16, 100
DATA_SEED = 1234


@dataclass(frozen=True)
class Config:
    steps: int = 40
    save_steps: int = 10
    batch_size: int = 4
    lr: float = 1e-3
    seed: int = 0
    sleep_per_step: float = 0.0
    slow_save: float = 0.0
    save_total_limit: int | None = None
    """The Trainer's own rotation: keep this many checkpoint folders (None: all)."""


class TokenData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Fixed synthetic sequences (the same for every seed, run and attempt), each its own label."""

    def __init__(self, sequences: int = SEQUENCES) -> None:
        generator = torch.Generator().manual_seed(DATA_SEED)
        self.tokens = torch.randint(0, VOCAB, (sequences, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class LossLog(TrainerCallback):
    """Keeps (step, loss) of every logged step and, on process zero, prints it as one JSON line;
    optionally slows every step down."""

    def __init__(self, attempt: int, sleep_per_step: float = 0.0, *, echo: bool = True) -> None:
        self.attempt = attempt
        self.sleep_per_step = sleep_per_step
        self.echo = echo
        self.losses: list[tuple[int, float]] = []

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **_: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        loss = float(logs["loss"])
        self.losses.append((state.global_step, loss))
        if self.echo:
            print_loss(state.global_step, loss, self.attempt)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if self.sleep_per_step:
            time.sleep(self.sleep_per_step)


class SlowSaveTrainer(Trainer):
    """Pauses between writing the weights and writing the optimizer state of every save."""

    slow_save = 0.0

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.slow_save:
            time.sleep(self.slow_save)
        super()._save_optimizer_and_scheduler(output_dir)


def gpt2_config(*, n_layer: int = 2, n_head: int = 2, n_embd: int = 32) -> GPT2Config:
    """The job's GPT-2 (2 layers, 2 heads, 32 wide by default) over the synthetic tokens'
    vocabulary (`VOCAB`); the tests and benches build theirs with it, wider or deeper."""
    return GPT2Config(
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=VOCAB, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


def trainer(
    cfg: Config, output_dir: str, callbacks: list[TrainerCallback], *, save: bool = True
) -> Trainer:
    torch.manual_seed(cfg.seed)
    model = GPT2LMHeadModel(gpt2_config())
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=cfg.steps,
        save_strategy="steps" if save else "no",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=1,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        seed=cfg.seed,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
    )
    built = SlowSaveTrainer(model=model, args=args, train_dataset=TokenData(), callbacks=callbacks)
    built.slow_save = cfg.slow_save
    return built


def baseline_losses(cfg: Config) -> list[tuple[int, float]]:
    """The same job uninterrupted, without ckpt-ha, saves or sleeps: its (step, loss)."""
    log = LossLog(attempt=0, echo=False)
    with tempfile.TemporaryDirectory() as out:
        trainer(cfg, out, [log], save=False).train()
    return log.losses


def parse(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="python -m ckpt_ha.lab.examples.hf_gpt2", description=__doc__)
    p.add_argument("--steps", type=int, default=Config.steps)
    p.add_argument("--save-steps", type=int, default=Config.save_steps)
    p.add_argument("--batch-size", type=int, default=Config.batch_size)
    p.add_argument("--lr", type=float, default=Config.lr)
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--sleep-per-step", type=float, default=0.0)
    p.add_argument("--slow-save", type=float, default=0.0)
    p.add_argument("--save-total-limit", type=int, default=None)
    a = p.parse_args(argv)
    if a.steps < 1 or a.save_steps < 1 or a.batch_size < 1:
        p.error("--steps, --save-steps and --batch-size must be >= 1")
    if a.save_total_limit is not None and a.save_total_limit < 1:
        p.error("--save-total-limit must be >= 1")
    return Config(a.steps, a.save_steps, a.batch_size, a.lr, a.seed, a.sleep_per_step,
                  a.slow_save, a.save_total_limit)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse(argv)
    ctx = sdk.context()
    if ctx is None:
        print("hf_gpt2: run it under `ckpt-ha run --job J -- ...`", file=sys.stderr)
        return 2
    print(f"hf_gpt2: {json.dumps(asdict(cfg))}", file=sys.stderr)
    callbacks = [hf.CkptHaCallback(), LossLog(ctx.attempt, cfg.sleep_per_step)]
    hf.train(trainer(cfg, hf.output_dir(ctx), callbacks), ctx=ctx)
    sdk.flush_progress()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
