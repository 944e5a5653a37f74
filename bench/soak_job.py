"""A low-CPU job for the 30-minute false-hang soak (issue 28; `bench_recovery.py --soak`).

Mostly sleeping, like a real job waiting on its accelerator: steps of 0.2-0.5 s with jitter
(now and then a step of 1-3 s), every 3-5 minutes an evaluation of 1-3 minutes marked with
`sdk.slow_phase("eval")`, every 6-8 minutes a checkpoint whose write takes 1-2 minutes (the
store is slowed down; `sdk.save` marks the save itself). Every step is reported with
`sdk.progress`. It runs until ``--until`` (seconds since the epoch): a relaunched attempt (a
false detection) resumes and ends at the same moment. Prints one JSON line per phase.

    python bench/soak_job.py --until EPOCH --seed 1   (under `ckpt-ha run`)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import BinaryIO

import numpy as np

from ckpt_ha import sdk
from ckpt_ha.lab.examples.numpy_mlp import _SlowStore
from ckpt_ha.storage import ObjectInfo, open_store


class OnceSlowStore(_SlowStore):
    """The first write of a checkpoint takes ``delay_s`` (a slow filesystem), the rest none."""

    def put(self, key: str, data: bytes | BinaryIO, *, metadata: object = None) -> ObjectInfo:
        self._wait()
        return self.inner.put(key, data, metadata=metadata)  # type: ignore[arg-type]

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: object = None
    ) -> ObjectInfo:
        self._wait()
        return self.inner.put_if_absent(key, data, metadata=metadata)  # type: ignore[arg-type]

    def _wait(self) -> None:
        delay, self.delay_s = self.delay_s, 0.0
        time.sleep(delay)


def say(**fields: object) -> None:
    print(json.dumps({"t": round(time.time(), 1), **fields}), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--until", type=float, required=True, help="end (seconds since the epoch)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=float, nargs=2, default=(180.0, 300.0))
    p.add_argument("--eval-takes", type=float, nargs=2, default=(60.0, 180.0))
    p.add_argument("--save-every", type=float, nargs=2, default=(360.0, 480.0))
    p.add_argument("--save-takes", type=float, nargs=2, default=(60.0, 120.0))
    args = p.parse_args()
    ctx = sdk.context()
    if ctx is None or ctx.storage_root is None:
        raise SystemExit("run it under `ckpt-ha run`")
    rng = random.Random(args.seed * 1000 + ctx.attempt)
    resumed = sdk.resume(tensors="numpy", ctx=ctx)
    step = 0 if resumed is None else int(resumed.step)
    say(event="start", attempt=ctx.attempt, step=step)
    now = time.monotonic()
    next_eval = now + rng.uniform(*args.eval_every)
    next_save = now + rng.uniform(*args.save_every)
    while time.time() < args.until:
        time.sleep(rng.uniform(1.0, 3.0) if rng.random() < 0.03 else rng.uniform(0.2, 0.5))
        step += 1
        sdk.progress(step, ctx=ctx)
        now = time.monotonic()
        if now >= next_eval:
            took = rng.uniform(*args.eval_takes)
            say(event="eval", step=step, seconds=round(took, 1))
            with sdk.slow_phase("eval", ctx):
                time.sleep(took)
            next_eval = time.monotonic() + rng.uniform(*args.eval_every)
        elif now >= next_save:
            took = rng.uniform(*args.save_takes)
            state = {"step": step, "weights": np.full(4096, float(step))}
            begun = time.monotonic()
            try:
                store = OnceSlowStore(open_store(ctx.storage_root), took)
                sdk.save(store, ctx.job_id, step, state, ctx=ctx)
            except sdk.CheckpointExists as exc:
                say(event="save_skipped", step=step, reason=str(exc))
            say(event="save", step=step, seconds=round(time.monotonic() - begun, 1))
            next_save = time.monotonic() + rng.uniform(*args.save_every)
    sdk.flush_progress()
    say(event="end", attempt=ctx.attempt, step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
