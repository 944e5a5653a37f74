"""A small deterministic numpy MLP training job, resumable bit for bit.

Everything the next step depends on is checkpointed with `sdk.save` every ``--checkpoint-every``
steps: the weights, Adam's moments and step count, the LR schedule, the data loader's epoch,
position and shuffled order, and the numpy ``Generator``'s full bit-generator state (it shuffles
each epoch and draws the dropout masks). On start the job calls `sdk.resume()`: with a plan it
continues from the restored step, and every later loss equals the uninterrupted run's exactly.
Every step is reported with `sdk.progress` and printed as one JSON line on stdout
(``{"step": s, "loss": float.hex(loss), "attempt": a}``).

    python -m ckpt_ha.lab.examples.numpy_mlp --steps 200 --checkpoint-every 20 --seed 7
    (outside a runner add --storage-root DIR --job NAME)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ckpt_ha import sdk
from ckpt_ha.contracts.resume import ResumeMode
from ckpt_ha.lab.examples import print_loss
from ckpt_ha.storage import (
    ListPage,
    ObjectInfo,
    ObjectStore,
    ReadStream,
    StorageError,
    open_store,
)

SAMPLES, FEATURES, HIDDEN = 512, 8, 32
DATASET_SEED = 20240601
"""The synthetic dataset is fixed: the same for every seed, run and attempt."""


@dataclass(frozen=True)
class Config:
    steps: int = 200
    checkpoint_every: int = 20
    seed: int = 0
    batch_size: int = 32
    lr: float = 0.01
    warmup: int = 10
    dropout: float = 0.1
    sleep_per_step: float = 0.0
    crash_at_step: int | None = None
    crash_after_resume: bool = False
    slow_save: float = 0.0
    """Seconds a checkpoint write takes at least (drills kill the job in the middle of one)."""


def dataset() -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(DATASET_SEED)
    x = gen.standard_normal((SAMPLES, FEATURES))
    w = gen.standard_normal((FEATURES, 1))
    y = np.tanh(x @ w) + 0.1 * np.sin(3 * x[:, :1]) + 0.05 * gen.standard_normal((SAMPLES, 1))
    return x, y


def lr_at(cfg: Config, step: int) -> float:
    """Linear warm-up, then cosine decay to 10% over the run (``step`` counts from 1)."""
    if step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def fresh_state(cfg: Config) -> dict[str, Any]:
    rng = np.random.default_rng(cfg.seed)
    params = {
        "w1": rng.standard_normal((FEATURES, HIDDEN)) / math.sqrt(FEATURES),
        "b1": np.zeros(HIDDEN),
        "w2": rng.standard_normal((HIDDEN, 1)) / math.sqrt(HIDDEN),
        "b2": np.zeros(1),
    }
    return {
        "step": 0,
        "model": params,
        "optimizer": {
            "t": 0,
            "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()},
            "betas": (0.9, 0.999),
            "eps": 1e-8,
        },
        "schedule": {"base_lr": cfg.lr, "warmup": cfg.warmup, "total": cfg.steps},
        "loader": {"epoch": 0, "position": 0, "order": rng.permutation(SAMPLES)},
        "rng": rng.bit_generator.state,
    }


def data_position(state: dict[str, Any]) -> int:
    """Samples consumed since the start: epoch * dataset size + position in this epoch."""
    loader = state["loader"]
    return int(loader["epoch"]) * SAMPLES + int(loader["position"])


def rng_fingerprint(state: dict[str, Any]) -> str:
    return sdk.fingerprint(state["rng"])


def describe(state: Any) -> tuple[int | None, str | None]:
    return data_position(state), rng_fingerprint(state)


def train_step(cfg: Config, state: dict[str, Any], x: np.ndarray, y: np.ndarray) -> float:
    """One Adam step on the next batch; returns the batch's loss before the update."""
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = state["rng"]
    loader = state["loader"]
    if loader["position"] + cfg.batch_size > SAMPLES:  # next epoch, newly shuffled
        loader["epoch"] += 1
        loader["position"] = 0
        loader["order"] = rng.permutation(SAMPLES)
    idx = loader["order"][loader["position"] : loader["position"] + cfg.batch_size]
    loader["position"] += cfg.batch_size
    xb, yb = x[idx], y[idx]

    p = state["model"]
    h = np.tanh(xb @ p["w1"] + p["b1"])
    keep = (rng.random(h.shape) >= cfg.dropout) / (1.0 - cfg.dropout)
    hd = h * keep
    pred = hd @ p["w2"] + p["b2"]
    err = pred - yb
    loss = float(np.mean(err**2))

    g_pred = 2.0 * err / err.size
    grads = {"w2": hd.T @ g_pred, "b2": g_pred.sum(axis=0)}
    g_h = (g_pred @ p["w2"].T) * keep * (1.0 - h**2)
    grads["w1"] = xb.T @ g_h
    grads["b1"] = g_h.sum(axis=0)

    opt = state["optimizer"]
    opt["t"] += 1
    t = opt["t"]
    b1, b2 = opt["betas"]
    lr = lr_at(cfg, t)
    for k, g in grads.items():
        opt["m"][k] = b1 * opt["m"][k] + (1 - b1) * g
        opt["v"][k] = b2 * opt["v"][k] + (1 - b2) * g * g
        m_hat = opt["m"][k] / (1 - b1**t)
        v_hat = opt["v"][k] / (1 - b2**t)
        p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + opt["eps"])
    state["rng"] = rng.bit_generator.state
    state["step"] += 1
    return loss


class _SlowStore(ObjectStore):
    """The job's store with its writes slowed down, spread over a checkpoint's files (drills
    kill the job mid-write); every other call goes straight to ``inner``."""

    def __init__(self, inner: ObjectStore, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after=start_after, page_size=page_size)

    def list_page(
        self, prefix: str = "", *, cursor: str | None = None, page_size: int = 1000
    ) -> ListPage:
        return self.inner.list_page(prefix, cursor=cursor, page_size=page_size)

    def stat(self, key: str) -> ObjectInfo:
        return self.inner.stat(key)

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        return self.inner.open_read(key, offset=offset, length=length)

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        time.sleep(self.delay_s)
        return self.inner.put(key, data, metadata=metadata)

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        time.sleep(self.delay_s)
        return self.inner.put_if_absent(key, data, metadata=metadata)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        return self.inner.copy(src_key, dst_key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def move(self, src_key: str, dst_key: str) -> ObjectInfo:
        return self.inner.move(src_key, dst_key)

    def uri(self, key: str) -> str:
        return self.inner.uri(key)


def _store(root: str, cfg: Config) -> str | ObjectStore:
    if cfg.slow_save <= 0:
        return root
    # About five writes per checkpoint here (index, four arrays, manifest).
    return _SlowStore(open_store(root), cfg.slow_save / 5)


def train(cfg: Config, ctx: sdk.Context, *, stop_at: int | None = None) -> list[tuple[int, float]]:
    """Run (or continue) the job; returns the (step, loss) pairs this attempt computed.

    ``stop_at``: return after that step, as if the process had been killed there (tests).
    """
    if ctx.storage_root is None:
        raise SystemExit("no storage root: run under `ckpt-ha run` or pass --storage-root")
    resumed = sdk.resume(describe=describe, tensors="numpy", ctx=ctx)
    state = fresh_state(cfg) if resumed is None else resumed.state
    if resumed is not None and resumed.plan.mode is ResumeMode.WEIGHTS_ONLY:
        # Not a resume: the weights only, with a fresh optimizer, data order and RNG.
        state = {**fresh_state(cfg), "model": resumed.state["model"], "step": resumed.step}
        print(f"weights-only init from {resumed.plan.checkpoint_id}", file=sys.stderr)
    elif resumed is not None:
        print(f"resumed from {resumed.plan.checkpoint_id} at step {state['step']}", file=sys.stderr)
        if cfg.crash_after_resume:
            raise SystemExit(f"crash requested right after the resume (step {state['step']})")
    x, y = dataset()
    losses: list[tuple[int, float]] = []
    while state["step"] < cfg.steps:
        step = state["step"] + 1
        if cfg.crash_at_step is not None and step == cfg.crash_at_step:
            raise SystemExit(f"crash requested at step {step}")
        loss = train_step(cfg, state, x, y)
        losses.append((step, loss))
        print_loss(step, loss, ctx.attempt)
        sdk.progress(
            step,
            data_position=data_position(state),
            rng_fingerprint=rng_fingerprint(state),
            metrics={"loss": loss, "lr": lr_at(cfg, step)},
            ctx=ctx,
        )
        if step % cfg.checkpoint_every == 0:
            try:
                sdk.save(_store(ctx.storage_root, cfg), ctx.job_id, step, state, ctx=ctx)
            except sdk.CheckpointExists as exc:  # an earlier attempt got this far already
                print(f"not saving step {step}: {exc}", file=sys.stderr)
            except StorageError as exc:
                # Storage is out: this checkpoint is lost (the writer watcher reports its
                # half-written folder), training goes on and the next checkpoint tries again.
                print(f"checkpoint at step {step} failed, training on: {exc}", file=sys.stderr)
        if stop_at is not None and step >= stop_at:
            break
        if cfg.sleep_per_step:
            time.sleep(cfg.sleep_per_step)
    return losses


def parse(argv: Sequence[str] | None, name: str = "numpy_mlp") -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(prog=f"python -m ckpt_ha.lab.examples.{name}")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sleep-per-step", type=float, default=0.0)
    p.add_argument("--crash-at-step", type=int, help="exit 1 on reaching this step (every attempt)")
    p.add_argument(
        "--crash-after-resume", action="store_true", help="exit 1 right after every resume"
    )
    p.add_argument(
        "--written-with-framework", metavar="VERSION",
        help="record this framework version in the checkpoints (drills: a changed environment)",
    )  # fmt: skip
    p.add_argument(
        "--slow-save", type=float, default=0.0, metavar="SECONDS",
        help="make every checkpoint write take this long (drills kill the job mid-write)",
    )  # fmt: skip
    p.add_argument("--storage-root", help="outside a runner: where to save")
    p.add_argument("--job", default=name.replace("_", "-"), help="outside a runner: the job id")
    args = p.parse_args(argv)
    cfg = Config(
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        sleep_per_step=args.sleep_per_step,
        crash_at_step=args.crash_at_step,
        crash_after_resume=args.crash_after_resume,
        slow_save=args.slow_save,
    )
    return cfg, args


def standalone(args: argparse.Namespace) -> sdk.Context:
    if args.storage_root and "://" not in args.storage_root:
        Path(args.storage_root).mkdir(parents=True, exist_ok=True)
    return sdk.Context(args.job, "standalone", 1, args.storage_root, None)


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse(argv)
    try:
        ctx = sdk.context() or standalone(args)
        if args.written_with_framework and ctx.environment is not None:
            # Drills: the checkpoints say they were written with another framework version than
            # the one the restore target runs (R14's changed environment).
            env = ctx.environment.model_copy(
                update={"framework_version": args.written_with_framework}
            )
            ctx = dataclasses.replace(ctx, environment=env)
        train(cfg, ctx)
    except sdk.ResumeFailed as exc:
        print(f"numpy_mlp: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
