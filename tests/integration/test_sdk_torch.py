"""Torch state dicts through the SDK: bit-for-bit round trip, and resuming a real model from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_ha import sdk
from tests.support.torch_tools import require_torch

torch = require_torch()


def trained() -> tuple[Any, Any]:
    """A Linear layer and its Adam optimizer after one step (so Adam has state to save)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    model(torch.randn(4, 8)).pow(2).sum().backward()
    opt.step()
    return model, opt


def raw(t: Any) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())


def same(a: object, b: object) -> bool:
    """Equal values of equal types, tensors compared bit for bit (dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad)
            and raw(a) == raw(b)
        )
    if isinstance(a, dict):
        return (
            type(a) is type(b)
            and list(a) == list(b)  # type: ignore[call-overload]
            and all(same(a[k], b[k]) for k in a)  # type: ignore[index]
        )
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)  # type: ignore[arg-type]
            and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[call-overload]
        )
    return type(a) is type(b) and a == b


def test_model_and_adam_state_round_trip_bit_for_bit_and_resume(tmp_path: Path) -> None:
    model, opt = trained()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}
    saved = sdk.save(str(tmp_path), "job-t", 1, state, run_id="run-1", project="p")
    env = saved.manifest.identity.environment  # type: ignore[union-attr]
    assert env is not None
    assert (env.framework, env.framework_version) == ("torch", torch.__version__)
    assert env.libraries["torch"] == torch.__version__

    loaded = sdk.load(saved.uri)
    assert same(state, loaded.state)
    nudged = loaded.state["model"]["bias"].clone()
    nudged.view(torch.int32)[0] ^= 1  # one bit off
    assert not same(state["model"]["bias"], nudged)
    assert loaded.state["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.95)
    assert sorted(loaded.state["optimizer"]["state"]) == [0, 1]  # int keys, as Adam wrote them

    fresh = torch.nn.Linear(8, 3)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1.0)
    fresh.load_state_dict(loaded.state["model"])
    fresh_opt.load_state_dict(loaded.state["optimizer"])
    assert same(fresh_opt.state_dict(), opt.state_dict())

    # Resuming means the next step is the same step the original would have taken.
    batch = torch.randn(4, 8)
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(batch).pow(2).sum().backward()
        o.step()
    assert same(fresh.state_dict(), model.state_dict())


def test_dtypes_shapes_and_devices_survive(tmp_path: Path) -> None:
    tensors = {
        "bf16": torch.randn(3, 2).to(torch.bfloat16),
        "f16": torch.randn(5).half(),
        "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # non-contiguous view
        "complex": torch.randn(2, dtype=torch.complex64),
    }
    saved = sdk.save(str(tmp_path), "job-t", 2, tensors, run_id="r")
    loaded = sdk.load(saved.uri)
    assert same(
        {k: v.contiguous() for k, v in tensors.items()},
        {k: v.contiguous() for k, v in loaded.state.items()},
    )
    with pytest.raises(sdk.NeedsTorch, match="bfloat16"):
        sdk.load(saved.uri, tensors="numpy")


def test_numpy_view_of_torch_tensors_where_torch_is_not_wanted(tmp_path: Path) -> None:
    model, _ = trained()
    saved = sdk.save(str(tmp_path), "job-t", 3, {"model": model.state_dict()}, run_id="r")
    loaded = sdk.load(saved.uri, tensors="numpy")
    weight = loaded.state["model"]["weight"]
    assert isinstance(weight, np.ndarray)
    assert np.array_equal(weight, model.weight.detach().numpy())


def test_sparse_tensors_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="dense"):
        sdk.save(str(tmp_path), "job-t", 4, {"s": torch.eye(3).to_sparse()}, run_id="r")
    assert not (tmp_path / "job-t" / "step-00000004").exists()


def test_a_contiguous_tensor_is_written_from_its_own_memory() -> None:
    """`save` writes a CPU tensor's leaf from the tensor's memory (no copy); the same bytes as
    `to_bytes`, for a non-contiguous tensor too (from a contiguous copy)."""
    from ckpt_ha.sdk.state import Leaf

    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = Leaf("t", tensor).to_buffer()
    assert isinstance(view, memoryview)
    assert bytes(view) == Leaf("t", tensor).to_bytes() == raw(tensor)
    tensor[0, 0] = 42.0  # the view is the tensor's memory
    assert bytes(view) == raw(tensor)
    transposed = tensor.t()
    assert bytes(Leaf("t", transposed).to_buffer()) == raw(transposed)


def test_save_copies_no_tensor(tmp_path: Path) -> None:
    """`save` writes each tensor from its own memory and hashes it on the way: nothing of a
    tensor's size is allocated (before, each leaf was copied into bytes first)."""
    import tracemalloc

    state = {f"layer{i}": torch.randn(1024, 1024) for i in range(4)}  # 4 MiB each
    sdk.save(str(tmp_path), "job", 0, state, run_id="r")  # the first use's imports
    tracemalloc.start()
    try:
        saved = sdk.save(str(tmp_path), "job", 1, state, run_id="r")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak
    back = sdk.load(saved.uri).state
    assert all(torch.equal(back[k], state[k]) for k in state)
