"""Example training jobs that use the SDK the way a real one should: everything that decides
the next step (weights, optimizer moments, LR schedule, data position, RNG) is in the
checkpoint, so a resumed run continues bit for bit. Run one under the runner:

    ckpt-ha run --job demo -- \
        python -m ckpt_ha.lab.examples.numpy_mlp --steps 200 --sleep-per-step 0.1
"""

from __future__ import annotations

import json
import sys


def print_loss(step: int, loss: float, attempt: int) -> None:
    """The loss line every example prints (``{"step", "loss": float.hex, "attempt"}``), in one
    write: ``print`` writes the text and its newline apart, so on an unbuffered stdout a job
    killed between the two left half a line, and the next attempt's line ran on after it."""
    line = json.dumps({"step": step, "loss": loss.hex(), "attempt": attempt})
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()
