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


def tensor_bits(torch: ModuleType, state: dict[str, Any]) -> dict[str, str]:
    """Every tensor's bytes (hex), by its path in the state: equal means bit for bit."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}", item)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value.detach().reshape(-1).view(torch.uint8).numpy().tobytes().hex()
        else:
            out[prefix] = repr(value)

    walk("", state)
    return out


def zeroed_like(torch: ModuleType, value: Any) -> Any:
    """The same structure with every tensor and number zeroed: what a fresh process holds."""
    if isinstance(value, dict):
        return {k: zeroed_like(torch, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(zeroed_like(torch, v) for v in value)
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return type(value)(0)
    return value


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


def write_large_torch_file(path: Path, obj: object, size: int) -> None:
    """A ``torch.save`` zip of ``obj`` whose tensor data is padded to ``size`` bytes with a hole
    (a sparse file: cheap to make at any size). Its ``data.pkl`` is torch's own for ``obj``;
    the first storage member holds the hole."""
    import struct
    import zipfile
    import zlib

    small = zipfile.ZipFile(io.BytesIO(torch_saved(obj)))
    members = [(i.filename, small.read(i)) for i in small.infolist()]
    storage = next(name for name, _ in members if "/data/" in name)
    hole = size - sum(len(data) + 200 for _, data in members)
    zeros, crc, left = bytes(64 * 1024 * 1024), 0, hole
    while left > 0:
        crc = zlib.crc32(zeros[: min(left, len(zeros))], crc)
        left -= len(zeros)
    central = b""
    with path.open("wb") as out:
        for name, data in members:
            raw = name.encode()
            length = hole if name == storage else len(data)
            check = crc if name == storage else zlib.crc32(data)
            fields = (20, 0, 0, 0, 0, check, length, length, len(raw), 0)
            offset = out.tell()
            out.write(b"PK\x03\x04" + struct.pack("<HHHHHIIIHH", *fields) + raw)
            if name == storage:
                out.seek(hole, os.SEEK_CUR)
            else:
                out.write(data)
            entry = struct.pack("<HHHHHHIIIHHHHHII", 20, *fields, 0, 0, 0, 0, offset)
            central += b"PK\x01\x02" + entry + raw
        start = out.tell()
        out.write(central)
        end = struct.pack("<HHHHIIH", 0, 0, len(members), len(members), len(central), start, 0)
        out.write(b"PK\x05\x06" + end)
