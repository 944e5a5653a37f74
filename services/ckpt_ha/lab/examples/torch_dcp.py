"""A multi-rank PyTorch job under torchrun saving DCP checkpoints through ckpt-ha, resumable bit
for bit: a small MLP trained data-parallel on the gloo backend (gradients averaged with
``all_reduce``), Adam, a fixed synthetic data set whose batch order follows from the step.

    ckpt-ha run --job mlp -- \
        torchrun --nproc_per_node 2 -m ckpt_ha.lab.examples.torch_dcp --steps 60

Every rank calls `ckpt_ha.sdk.dcp.save` every ``--checkpoint-every`` steps (each writes its own
shards; rank 0 commits once all have) and `ckpt_ha.sdk.dcp.resume` at start (every rank loads the
planned checkpoint in place). Rank 0 reports progress and prints one JSON line per step
(``{"step": s, "loss": float.hex(loss), "attempt": a}``). ``--slow-save S`` holds every save S
seconds after the data files are written and before ``.metadata`` (drills kill a rank there).
The other ranks mark each step they finish (`ckpt_ha.sdk.mark_step`: the runner's hang detection
watches every rank). ``--hang-rank R --hang-at-step N`` makes rank R stop at step N of the first
attempt (after the step's collectives, before reporting it) and sleep: the others then wait for
it in the next step's ``all_reduce``, processes alive, progress stopped (the ``hang`` drill).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.storage import WriteResult

from ckpt_ha import sdk
from ckpt_ha.lab.examples import print_loss
from ckpt_ha.sdk import dcp

SAMPLES, FEATURES, HIDDEN = 512, 16, 32
DATA_SEED = 20240601


@dataclass(frozen=True)
class Config:
    steps: int = 60
    checkpoint_every: int = 10
    batch_size: int = 32
    lr: float = 0.01
    seed: int = 0
    sleep_per_step: float = 0.0
    slow_save: float = 0.0
    hang_rank: int | None = None
    hang_at_step: int | None = None


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    y = torch.tanh(x @ torch.randn(FEATURES, 1, generator=gen)) + 0.1 * torch.sin(3 * x[:, :1])
    return x, y


def batch(step: int, cfg: Config, rank: int, world: int) -> torch.Tensor:
    """This rank's part of the global batch of ``step``: the order of an epoch follows from its
    number, so the data position is the step (nothing else to checkpoint)."""
    per_epoch = SAMPLES // cfg.batch_size
    epoch, index = divmod(step - 1, per_epoch)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(DATA_SEED + epoch))
    rows = order[index * cfg.batch_size : (index + 1) * cfg.batch_size]
    return rows[rank::world]


class SlowFinishWriter(FileSystemWriter):
    """Holds the save after every rank's data files are written, before ``.metadata``."""

    delay_s = 0.0

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        time.sleep(self.delay_s)
        super().finish(metadata, results)


def train(cfg: Config, ctx: sdk.Context) -> list[tuple[int, float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # optimizer state initialised
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "step": 0}
    resumed = dcp.resume(state, ctx=ctx, describe=lambda s: (int(s["step"]), None))
    if resumed is not None:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])  # fmt: skip
        if rank == 0:
            print(f"resumed from {resumed.plan.checkpoint_id} at step {state['step']}",
                  file=sys.stderr)  # fmt: skip
    x, y = dataset()

    def writer(path: str) -> FileSystemWriter:
        built = SlowFinishWriter(path)
        built.delay_s = cfg.slow_save
        return built

    losses: list[tuple[int, float]] = []
    for step in range(int(state["step"]) + 1, cfg.steps + 1):
        rows = batch(step, cfg, rank, world)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()  # type: ignore[no-untyped-call]
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        value = float(mean) / world
        losses.append((step, value))
        if rank == cfg.hang_rank and step == cfg.hang_at_step and ctx.attempt == 1:
            print(f"rank {rank}: hanging at step {step} (--hang-at-step)", file=sys.stderr)
            time.sleep(24 * 3600)
        if rank != 0:
            sdk.mark_step(step, ctx=ctx)
        if rank == 0:
            print_loss(step, value, ctx.attempt)
            sdk.progress(step, data_position=step, metrics={"loss": value}, ctx=ctx)
        if step % cfg.checkpoint_every == 0:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            saving = {"model": model_sd, "optim": optim_sd, "step": step}
            dcp.save(saving, step=step, ctx=ctx, data_position=step, writer=writer)
        if cfg.sleep_per_step:
            time.sleep(cfg.sleep_per_step)
    return losses


def baseline_losses(cfg: Config) -> list[tuple[int, float]]:
    """The same computation uninterrupted in one process standing for every rank: the global
    batch's mean loss and gradient are what the ranks' average gives (same rows, same math)."""
    torch.manual_seed(cfg.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    get_state_dict(model, optimizer)  # as the job does: it initialises Adam's state (step 1)
    x, y = dataset()
    out = []
    for step in range(1, cfg.steps + 1):
        parts = [batch(step, cfg, r, 2) for r in range(2)]
        optimizer.zero_grad()
        losses = [torch.nn.functional.mse_loss(model(x[rows]), y[rows]) for rows in parts]
        ((losses[0] + losses[1]) / 2).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        out.append((step, float(losses[0].detach() + losses[1].detach()) / 2))
    return out


def parse(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="python -m ckpt_ha.lab.examples.torch_dcp")
    p.add_argument("--steps", type=int, default=Config.steps)
    p.add_argument("--checkpoint-every", type=int, default=Config.checkpoint_every)
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--sleep-per-step", type=float, default=0.0)
    p.add_argument("--slow-save", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--hang-rank", type=int, default=None, metavar="RANK")
    p.add_argument("--hang-at-step", type=int, default=None, metavar="STEP")
    a = p.parse_args(argv)
    if a.steps < 1 or a.checkpoint_every < 1:
        p.error("--steps and --checkpoint-every must be >= 1")
    return Config(steps=a.steps, checkpoint_every=a.checkpoint_every, seed=a.seed,
                  sleep_per_step=a.sleep_per_step, slow_save=a.slow_save,
                  hang_rank=a.hang_rank, hang_at_step=a.hang_at_step)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse(argv)
    ctx = sdk.context()
    if ctx is None:
        print("torch_dcp: run it under `ckpt-ha run --job J -- torchrun ...`", file=sys.stderr)
        return 2
    dist.init_process_group("gloo")
    try:
        if dist.get_rank() == 0:
            print(f"torch_dcp: {json.dumps(asdict(cfg))}", file=sys.stderr)
        train(cfg, ctx)
        sdk.flush_progress()
        dist.barrier()  # both ranks done before either tears gloo down
    except sdk.ResumeFailed as exc:
        print(f"torch_dcp: {exc}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
