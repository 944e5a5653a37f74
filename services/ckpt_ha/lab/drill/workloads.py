"""The training jobs drills run under `ckpt-ha run`: how to launch one, and its fixed baseline
(model, data, config, environment, resources) with the reference loss curve of the same job run
uninterrupted with the same seed.

Every workload prints one JSON line per step on its first process's stdout (``step``,
``loss`` as a hex float, ``attempt``): what `evidence.drill_losses` reads from the runner log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

EXAMPLE = "ckpt_ha.lab.examples.numpy_mlp"


@dataclass(frozen=True)
class Workload:
    name: str
    argv: Callable[[Sequence[str]], list[str]]
    """The training command for these job arguments (what follows ``ckpt-ha run ... --``)."""
    baseline: Callable[[Sequence[str]], dict[str, Any]]
    baseline_losses: Callable[[Sequence[str]], list[list[float]]]
    """(step, loss) of the uninterrupted run with the same arguments and seed."""
    processes: int = 1
    """Training processes per attempt (ranks)."""


def _numpy_baseline(job_args: Sequence[str]) -> dict[str, Any]:
    """What every drill keeps fixed: model, data, config, environment and resources."""
    import numpy as np

    from ckpt_ha.lab.examples import numpy_mlp

    cfg, _ = numpy_mlp.parse(list(job_args))
    return {
        "model": f"{EXAMPLE}: MLP {numpy_mlp.FEATURES}-{numpy_mlp.HIDDEN}-1 (tanh, dropout "
        f"{cfg.dropout}), Adam, warm-up then cosine LR",
        "data": f"synthetic regression set, {numpy_mlp.SAMPLES} x {numpy_mlp.FEATURES}, "
        f"dataset seed {numpy_mlp.DATASET_SEED}, batch {cfg.batch_size}",
        "config": dataclasses.asdict(cfg),
        "job_args": list(job_args),
        "environment": {"python": platform.python_version(), "numpy": np.__version__,
                        "platform": platform.platform()},
        "resources": {"cpus": os.cpu_count(), "processes": 1, "gpus": 0},
    }  # fmt: skip


def _numpy_losses(job_args: Sequence[str]) -> list[list[float]]:
    """The uninterrupted run of the same job with the same seed, in-process: (step, loss)."""
    from ckpt_ha import sdk
    from ckpt_ha.lab.examples import numpy_mlp

    cfg, _ = numpy_mlp.parse(list(job_args))
    # Checkpoints, sleeps and crashes change no loss: the reference run does without them.
    cfg = dataclasses.replace(
        cfg, checkpoint_every=cfg.steps + 1, sleep_per_step=0.0, slow_save=0.0,
        crash_at_step=None, crash_after_resume=False,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(io.StringIO()):
        losses = numpy_mlp.train(cfg, sdk.Context("baseline", "baseline", 1, root, None))
    return [[step, loss] for step, loss in losses]


NUMPY = Workload(
    name="numpy-mlp",
    argv=lambda args: [sys.executable, "-m", EXAMPLE, *args],
    baseline=_numpy_baseline,
    baseline_losses=_numpy_losses,
)


HF_EXAMPLE = "ckpt_ha.lab.examples.hf_gpt2"


def _hf_baseline(job_args: Sequence[str]) -> dict[str, Any]:
    from importlib import metadata

    from ckpt_ha.lab.examples import hf_gpt2

    cfg = hf_gpt2.parse(list(job_args))
    versions = {name: metadata.version(name) for name in ("torch", "transformers", "accelerate")}
    return {
        "model": f"{HF_EXAMPLE}: GPT-2 from a config (2 layers, 2 heads, width 32, vocab "
        f"{hf_gpt2.VOCAB}), Hugging Face Trainer (AdamW, linear LR), ckpt-ha's TrainerCallback",
        "data": f"synthetic tokens, {hf_gpt2.SEQUENCES} x {hf_gpt2.LENGTH}, seed "
        f"{hf_gpt2.DATA_SEED}, batch {cfg.batch_size}",
        "config": dataclasses.asdict(cfg),
        "job_args": list(job_args),
        "environment": {"python": platform.python_version(), **versions,
                        "platform": platform.platform()},
        "resources": {"cpus": os.cpu_count(), "processes": 1, "gpus": 0},
    }  # fmt: skip


def _hf_losses(job_args: Sequence[str]) -> list[list[float]]:
    from ckpt_ha.lab.examples import hf_gpt2

    cfg = dataclasses.replace(hf_gpt2.parse(list(job_args)), sleep_per_step=0.0, slow_save=0.0)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        losses = hf_gpt2.baseline_losses(cfg)
    return [[step, loss] for step, loss in losses]


HF_TRAINER = Workload(
    name="hf-trainer",
    argv=lambda args: [sys.executable, "-m", HF_EXAMPLE, *args],
    baseline=_hf_baseline,
    baseline_losses=_hf_losses,
)


DCP_EXAMPLE = "ckpt_ha.lab.examples.torch_dcp"
RANKS = 2


def _dcp_baseline(job_args: Sequence[str]) -> dict[str, Any]:
    from importlib import metadata

    from ckpt_ha.lab.examples import torch_dcp

    cfg = torch_dcp.parse(list(job_args))
    return {
        "model": f"{DCP_EXAMPLE}: MLP {torch_dcp.FEATURES}-{torch_dcp.HIDDEN}-1 (tanh), Adam, "
        f"data parallel over {RANKS} ranks (gloo all_reduce), PyTorch DCP checkpoints through "
        "ckpt_ha.sdk.dcp",
        "data": f"synthetic regression set, {torch_dcp.SAMPLES} x {torch_dcp.FEATURES}, "
        f"seed {torch_dcp.DATA_SEED}, global batch {cfg.batch_size}",
        "config": dataclasses.asdict(cfg),
        "job_args": list(job_args),
        "environment": {"python": platform.python_version(), "torch": metadata.version("torch"),
                        "launcher": f"torchrun --standalone --nproc_per_node {RANKS}",
                        "platform": platform.platform()},
        "resources": {"cpus": os.cpu_count(), "processes": RANKS, "gpus": 0},
    }  # fmt: skip


def _dcp_losses(job_args: Sequence[str]) -> list[list[float]]:
    from ckpt_ha.lab.examples import torch_dcp

    cfg = torch_dcp.parse(list(job_args))
    return [[step, loss] for step, loss in torch_dcp.baseline_losses(cfg)]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(RANKS)]  # fmt: skip
TORCHRUN_DCP = Workload(
    name="torchrun-dcp",
    argv=lambda args: [*TORCHRUN, "-m", DCP_EXAMPLE, *args],
    baseline=_dcp_baseline,
    baseline_losses=_dcp_losses,
    processes=RANKS,
)
TAKEOVER_ONE_RANK = dataclasses.replace(
    TORCHRUN_DCP,
    name="torchrun-dcp-1-rank",
    argv=lambda args: [*TORCHRUN[:-1], "1", "-m", DCP_EXAMPLE, *args],
    processes=1,
)
"""The same job on one rank: what takes over a 2-rank run whose host is gone (`reshard`)."""
