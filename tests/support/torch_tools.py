"""Real PyTorch checkpoints for format tests, and pickles that would run code if loaded.

torch is the ``torch`` extra, which the README's test command installs (`scripts/bootstrap
--dev`). A missing torch fails the test, like a missing service does in tests/conftest.py: it
never skips.
"""

from __future__ import annotations

import io
import os
import random
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest


def require_torch() -> ModuleType:
    """torch, or a failed test saying how to install it (never a skip)."""
    try:
        import torch
    except ImportError as exc:
        pytest.fail(f"torch is required and not installed ({exc}): run scripts/bootstrap --dev")
    return torch


class Payload:
    """Pickles to a call of ``os.system`` that creates ``marker``: proof if it ever runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class ExecPayload:
    """Pickles to ``builtins.exec`` of code that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def training_state(torch: ModuleType, step: int | None = 7) -> dict[str, Any]:
    """A small model and Adam optimizer after one real step, as a DCP state dict."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).sum().backward()
    optimizer.step()
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optim": optimizer.state_dict(),
        "extra": {"half": torch.ones(3, dtype=torch.bfloat16), "note": "x"},
    }
    if step is not None:
        state["step"] = step
    return state


def write_dcp(folder: Path, state: dict[str, Any] | None = None, step: int | None = 7) -> Path:
    """``torch.distributed.checkpoint.save`` in this process (no process group)."""
    torch = require_torch()
    from torch.distributed.checkpoint import FileSystemWriter, save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        save(
            state if state is not None else training_state(torch, step),
            storage_writer=FileSystemWriter(str(folder)),
            no_dist=True,
        )
    return folder


def rewrite_metadata(folder: Path, change: Any) -> None:
    """Unpickle our own ``.metadata`` with torch's classes, ``change`` it, pickle it back."""
    import pickle

    require_torch()
    path = folder / ".metadata"
    metadata = pickle.loads(path.read_bytes())
    change(metadata)
    path.write_bytes(pickle.dumps(metadata))


def write_hf_torch_files(folder: Path) -> None:
    """What the Trainer writes next to the weights, made by torch itself."""
    torch = require_torch()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    torch.save(
        {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        },
        folder / "rng_state.pth",
    )


def torch_saved(obj: object) -> bytes:
    torch = require_torch()
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def tiny_gpt2() -> Any:
    """A 2-layer GPT-2 (32-wide, 100-token vocabulary) built from a config in code: nothing is
    downloaded."""
    torch = require_torch()
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as exc:
        pytest.fail(
            f"transformers is required and not installed ({exc}): run scripts/bootstrap --dev"
        )
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def run_trainer(output_dir: Path, *, max_steps: int, save_steps: int) -> None:
    """A real Hugging Face ``Trainer`` run of `tiny_gpt2` on synthetic token sequences, on the
    CPU, saving a ``checkpoint-<step>`` folder every ``save_steps`` steps."""
    torch = require_torch()
    from transformers import Trainer, TrainingArguments

    tokens = torch.randint(0, 100, (16, 12), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in tokens]
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        save_steps=save_steps,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(model=tiny_gpt2(), args=args, train_dataset=data).train()
