"""Torch tensors as raw bytes plus dtype and shape. Imported only where torch already is (saving
a tensor) or is installed (loading one), so the SDK itself never needs torch."""

from __future__ import annotations

from typing import Any

import torch

_NAMES = (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32",
    "uint64",
)  # fmt: skip
_DTYPES: dict[str, torch.dtype] = {
    name: dtype for name in _NAMES if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"torch tensor expected, got {type(value).__name__}")
    return value


def _check(tensor: torch.Tensor) -> None:
    if tensor.layout is not torch.strided or tensor.is_quantized:
        raise TypeError(f"only dense tensors can be saved, not {tensor.layout} / quantized")
    if _name(tensor.dtype) not in _DTYPES:
        raise TypeError(f"tensor dtype {tensor.dtype} is not supported")


def describe(value: object) -> dict[str, Any]:
    """What the index records so the bytes can be read back: dtype, shape, byte order."""
    tensor = _tensor(value)
    _check(tensor)
    return {"dtype": _name(tensor.dtype), "shape": list(tensor.shape), "byteorder": "little"}


def to_view(value: object) -> memoryview:
    """The tensor's elements in row-major order, as stored in memory (bit for bit): a view of
    the tensor's own memory when it is a contiguous CPU tensor, else of a contiguous copy."""
    tensor = _tensor(value)
    _check(tensor)
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data  # the array (its base) keeps the tensor alive


def to_bytes(value: object) -> bytes:
    """`to_view`'s bytes, copied."""
    return to_view(value).tobytes()


def from_bytes(data: bytes, dtype: str, shape: list[int]) -> torch.Tensor:
    if dtype not in _DTYPES:
        raise ValueError(f"tensor dtype {dtype} is not supported by torch {torch.__version__}")
    if not data:
        return torch.empty(shape, dtype=_DTYPES[dtype])
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(_DTYPES[dtype]).reshape(shape)


def version() -> str:
    return str(torch.__version__)
