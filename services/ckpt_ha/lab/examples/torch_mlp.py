"""The PyTorch variant of `numpy_mlp`: a ``torch.nn`` MLP, ``torch.optim.Adam``, a ``LambdaLR``
schedule and a ``torch.Generator`` (it shuffles each epoch and draws the dropout masks), all in
the checkpoint; resumed runs continue bit for bit on CPU (float64, deterministic algorithms,
one thread). Same options and output as `numpy_mlp`; needs the ``torch`` extra.

    python -m ckpt_ha.lab.examples.torch_mlp --steps 200 --checkpoint-every 20 --seed 7
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from ckpt_ha import sdk
from ckpt_ha.contracts.resume import ResumeMode
from ckpt_ha.lab.examples import print_loss
from ckpt_ha.lab.examples.numpy_mlp import (
    FEATURES,
    HIDDEN,
    SAMPLES,
    Config,
    dataset,
    lr_at,
    parse,
    standalone,
)


def deterministic() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


class Job:
    """Model, optimizer, schedule, loader position and generator: the whole training state."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.generator = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # nn.Linear's initialisation uses the global generator
        self.model = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
        ).double()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        # LambdaLR multiplies the base lr; lr_at(cfg, t) / cfg.lr for the optimizer's t-th step.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda epoch: lr_at(cfg, epoch + 1) / cfg.lr
        )
        self.step = 0
        self.epoch = 0
        self.position = 0
        self.order = torch.randperm(SAMPLES, generator=self.generator)

    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {
                k: v for k, v in self.scheduler.state_dict().items() if k != "lr_lambdas"
            },
            "loader": {"epoch": self.epoch, "position": self.position, "order": self.order},
            "rng": self.generator.get_state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict({**state["scheduler"], "lr_lambdas": [None]})
        self.step = int(state["step"])
        self.epoch = int(state["loader"]["epoch"])
        self.position = int(state["loader"]["position"])
        self.order = state["loader"]["order"]
        self.generator.set_state(state["rng"])

    def data_position(self) -> int:
        return self.epoch * SAMPLES + self.position

    def rng_fingerprint(self) -> str:
        return sdk.fingerprint(self.generator.get_state())

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        cfg = self.cfg
        if self.position + cfg.batch_size > SAMPLES:
            self.epoch += 1
            self.position = 0
            self.order = torch.randperm(SAMPLES, generator=self.generator)
        idx = self.order[self.position : self.position + cfg.batch_size]
        self.position += cfg.batch_size
        first, act, last = self.model
        h = act(first(x[idx]))
        keep = torch.bernoulli(
            torch.full(h.shape, 1.0 - cfg.dropout, dtype=torch.float64), generator=self.generator
        ) / (1.0 - cfg.dropout)
        loss = torch.mean((last(h * keep) - y[idx]) ** 2)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return float(loss.item())


def describe(state: Any) -> tuple[int | None, str | None]:
    loader = state["loader"]
    return int(loader["epoch"]) * SAMPLES + int(loader["position"]), sdk.fingerprint(state["rng"])


def train(cfg: Config, ctx: sdk.Context, *, stop_at: int | None = None) -> list[tuple[int, float]]:
    if ctx.storage_root is None:
        raise SystemExit("no storage root: run under `ckpt-ha run` or pass --storage-root")
    deterministic()
    job = Job(cfg)
    resumed = sdk.resume(describe=describe, tensors="auto", ctx=ctx)
    if resumed is not None and resumed.plan.mode is ResumeMode.WEIGHTS_ONLY:
        # Not a resume: the weights only, with a fresh optimizer, data order and generator.
        job.model.load_state_dict(resumed.state["model"])
        job.step = resumed.step
        print(f"weights-only init from {resumed.plan.checkpoint_id}", file=sys.stderr)
    elif resumed is not None:
        job.restore(resumed.state)
        print(f"resumed from {resumed.plan.checkpoint_id} at step {job.step}", file=sys.stderr)
        if cfg.crash_after_resume:
            raise SystemExit(f"crash requested right after the resume (step {job.step})")
    xn, yn = dataset()
    x, y = torch.from_numpy(xn), torch.from_numpy(yn)
    losses: list[tuple[int, float]] = []
    while job.step < cfg.steps:
        step = job.step + 1
        if cfg.crash_at_step is not None and step == cfg.crash_at_step:
            raise SystemExit(f"crash requested at step {step}")
        loss = job.train_step(x, y)
        losses.append((step, loss))
        print_loss(step, loss, ctx.attempt)
        sdk.progress(
            step,
            data_position=job.data_position(),
            rng_fingerprint=job.rng_fingerprint(),
            metrics={"loss": loss, "lr": float(job.scheduler.get_last_lr()[0])},
            ctx=ctx,
        )
        if step % cfg.checkpoint_every == 0:
            try:
                sdk.save(ctx.storage_root, ctx.job_id, step, job.state(), ctx=ctx)
            except sdk.CheckpointExists as exc:
                print(f"not saving step {step}: {exc}", file=sys.stderr)
        if stop_at is not None and step >= stop_at:
            break
        if cfg.sleep_per_step:
            time.sleep(cfg.sleep_per_step)
    return losses


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse(argv, "torch_mlp")
    try:
        ctx = sdk.context() or standalone(args)
        train(cfg, ctx)
    except sdk.ResumeFailed as exc:
        print(f"torch_mlp: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
