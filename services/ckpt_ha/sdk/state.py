"""State trees to shard files and back, never through pickle. Pure: no I/O.

A training state is a tree: mappings (``model.state_dict()``, ``optimizer.state_dict()``), lists
and tuples (``param_groups``, ``betas``), plain JSON-able values (ints, floats, strings, bools,
None) and array leaves (bytes, numpy arrays, torch tensors). Array leaves become one shard file
each under ``state/``; everything else, including every container's type and its keys' types,
goes into the index ``ckpt-ha.state.json``. The index is itself a shard listed in the manifest,
so it is checksummed like the data, and it is small, so the SDK writes it first.

Torch tensors are stored as their raw little-endian bytes with dtype and shape in the index;
numpy arrays as ``.npy`` written with ``allow_pickle=False``. Anything else is refused.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

INDEX = "ckpt-ha.state.json"
INDEX_FORMAT = "ckpt-ha/state/v1"
LEAVES = "state"
"""Array leaves live under this folder, so no leaf name can look like another format's marker."""

Tensors = Literal["auto", "numpy"]
"""How `decode` returns tensors saved from torch: torch tensors if torch imports, or numpy."""

Key = str | int | float | bool | None
_MAX_COMPONENT = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

# torch dtype name → numpy dtype, for reading torch tensors where torch is not installed.
_NUMPY_OF_TORCH = {
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "?",
    "complex64": "<c8",
    "complex128": "<c16",
}


class UnsupportedState(TypeError):
    """A state leaf that cannot be stored without pickle (or a key JSON cannot keep)."""

    def __init__(self, where: str, value: object) -> None:
        self.where = where
        self.type_name = type(value).__name__
        super().__init__(
            f"state at {where or '<root>'}: {self.type_name} cannot be saved without pickle "
            "(supported: mappings, lists, tuples, str/int/float/bool/None, bytes, numpy arrays, "
            "torch tensors)"
        )


class UnreadableState(ValueError):
    """The index does not describe a state tree this SDK can rebuild."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{INDEX}: {reason}")


class NeedsTorch(UnreadableState):
    """A tensor whose dtype numpy cannot hold (e.g. bfloat16): load it where torch is installed."""

    def __init__(self, path: str, dtype: str) -> None:
        self.path = path
        self.dtype = dtype
        super().__init__(f"{path}: torch dtype {dtype} has no numpy equivalent; install torch")


@dataclass(frozen=True)
class Leaf:
    """One array leaf: the shard path it is stored at and the value to serialise."""

    path: str
    value: object

    def to_bytes(self) -> bytes:
        """Serialised lazily, so a save holds one leaf's bytes at a time, not the whole state."""
        value = self.value
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, np.ndarray | np.generic):
            buf = io.BytesIO()
            np.save(buf, np.asarray(value), allow_pickle=False)
            return buf.getvalue()
        from ckpt_ha.sdk import torch_leaves  # only reached for a tensor: torch is imported

        return torch_leaves.to_bytes(value)

    def to_buffer(self) -> bytes | memoryview:
        """`to_bytes`' bytes, without the copy where the value's memory already holds them (a
        torch tensor on the CPU, contiguous): what `save` writes from. Valid while the value is
        left unchanged."""
        if isinstance(self.value, bytes | bytearray | memoryview | np.ndarray | np.generic):
            return self.to_bytes()
        from ckpt_ha.sdk import torch_leaves

        return torch_leaves.to_view(self.value)


@dataclass(frozen=True)
class Encoded:
    index: bytes
    leaves: tuple[Leaf, ...]
    frameworks: frozenset[str]
    """Array libraries the leaves came from: "numpy", "torch"."""


class _Names:
    """Shard paths from tree paths: readable, safe on S3 and POSIX, and never colliding."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def claim(self, parts: list[str], suffix: str) -> str:
        safe = [_component(p) for p in parts] or ["_"]
        base = "/".join([LEAVES, *safe])
        path, n = base + suffix, 1
        while path in self.files or path in self.dirs or self._under_file(path):
            n += 1
            path = f"{base}~{n}{suffix}"
        self.files.add(path)
        pieces = path.split("/")
        self.dirs.update("/".join(pieces[:i]) for i in range(1, len(pieces)))
        return path

    def _under_file(self, path: str) -> bool:
        pieces = path.split("/")
        return any("/".join(pieces[:i]) in self.files for i in range(1, len(pieces)))


def _component(key: object) -> str:
    text = _UNSAFE.sub("_", str(key))[:_MAX_COMPONENT] or "_"
    return "_" + text if set(text) == {"."} else text


def _is_tensor(value: object) -> bool:
    # A tensor can only exist if its caller imported torch: never import it here to find out.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def encode(state: Mapping[str, object]) -> Encoded:
    """Split ``state`` into the index (structure and small values) and array leaves."""
    if not isinstance(state, Mapping):
        raise UnsupportedState("", state)
    names = _Names()
    leaves: list[Leaf] = []
    frameworks: set[str] = set()

    def node(value: object, parts: list[str]) -> dict[str, Any]:
        where = "/".join(parts)
        if isinstance(value, Mapping):
            items = []
            for key, child in value.items():
                if not isinstance(key, str | int | float | bool | None):
                    raise UnsupportedState(f"{where}[{key!r}] (key)", key)
                if isinstance(key, float) and not math.isfinite(key):
                    raise UnsupportedState(f"{where}[{key!r}] (key)", key)
                items.append([key, node(child, [*parts, str(key)])])
            out: dict[str, Any] = {"kind": "mapping", "items": items}
            if isinstance(value, OrderedDict):
                out["kind"] = "ordered_mapping"
                metadata = getattr(value, "_metadata", None)  # module versions of a state_dict
                if isinstance(metadata, Mapping):
                    out["metadata"] = node(metadata, [*parts, "_metadata"])
            return out
        if isinstance(value, list | tuple):
            kind = "list" if isinstance(value, list) else "tuple"
            return {"kind": kind, "items": [node(v, [*parts, str(i)]) for i, v in enumerate(value)]}
        if value is None or isinstance(value, bool | int | str):
            return {"kind": "value", "value": value}
        if isinstance(value, float):
            return {"kind": "float", "value": value if math.isfinite(value) else repr(value)}
        if isinstance(value, bytes | bytearray | memoryview):
            leaves.append(Leaf(names.claim(parts, ""), value))
            return {"kind": "bytes", "shard": leaves[-1].path}
        if isinstance(value, np.ndarray | np.generic):
            if np.asarray(value).dtype.hasobject:
                raise UnsupportedState(where, value)
            frameworks.add("numpy")
            leaves.append(Leaf(names.claim(parts, ".npy"), value))
            return {
                "kind": "numpy",
                "shard": leaves[-1].path,
                "scalar": isinstance(value, np.generic),
            }
        if _is_tensor(value):
            from ckpt_ha.sdk import torch_leaves

            frameworks.add("torch")
            leaves.append(Leaf(names.claim(parts, ".bin"), value))
            return {"kind": "torch", "shard": leaves[-1].path, **torch_leaves.describe(value)}
        raise UnsupportedState(where, value)

    root = node(state, [])
    index = json.dumps({"format": INDEX_FORMAT, "root": root}, indent=1).encode()
    return Encoded(index, tuple(leaves), frozenset(frameworks))


def decode(index: bytes, read: Callable[[str], bytes], *, tensors: Tensors = "auto") -> Any:
    """Rebuild the tree the index describes; ``read(path)`` returns a shard's bytes."""
    try:
        doc = json.loads(index)
    except (ValueError, RecursionError) as exc:  # ValueError: also a 5,000-digit number
        raise UnreadableState(f"not valid JSON ({str(exc)[:200]})") from exc
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
        raise UnreadableState(f"format is not {INDEX_FORMAT!r}")
    use_torch = tensors == "auto" and _torch_available()

    def build(n: object) -> Any:
        if not isinstance(n, dict):
            raise UnreadableState(f"node {n!r} is not an object")
        kind = n.get("kind")
        if kind in ("mapping", "ordered_mapping"):
            pairs = [(k, build(v)) for k, v in n["items"]]
            if kind == "mapping":
                return dict(pairs)
            out: OrderedDict[Key, Any] = OrderedDict(pairs)
            if "metadata" in n:
                out._metadata = build(n["metadata"])  # type: ignore[attr-defined]
            return out
        if kind == "list":
            return [build(v) for v in n["items"]]
        if kind == "tuple":
            return tuple(build(v) for v in n["items"])
        if kind == "value":
            return n["value"]
        if kind == "float":
            return float(n["value"])
        if kind == "bytes":
            return read(n["shard"])
        if kind == "numpy":
            array = np.load(io.BytesIO(read(n["shard"])), allow_pickle=False)
            return array[()] if n.get("scalar") else array
        if kind == "torch":
            data = read(n["shard"])
            if n.get("byteorder", "little") != "little" or sys.byteorder != "little":
                raise UnreadableState(f"{n['shard']}: only little-endian tensors are supported")
            if use_torch:
                from ckpt_ha.sdk import torch_leaves

                return torch_leaves.from_bytes(data, n["dtype"], n["shape"])
            return _numpy_of_torch(n["shard"], data, n["dtype"], n["shape"])
        raise UnreadableState(f"unknown node kind {kind!r}")

    try:
        return build(doc.get("root"))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, UnreadableState):
            raise
        raise UnreadableState(f"malformed node ({exc!r})") from exc


def decode_plain(shards: Mapping[str, bytes]) -> dict[str, Any]:
    """A native checkpoint without a state index: ``*.npy`` shards as arrays, others as bytes."""
    out: dict[str, Any] = {}
    for path, data in shards.items():
        if path.endswith(".npy"):
            out[path.removesuffix(".npy")] = np.load(io.BytesIO(data), allow_pickle=False)
        else:
            out[path] = data
    return out


def _torch_available() -> bool:
    from importlib.util import find_spec

    return "torch" in sys.modules or find_spec("torch") is not None


def _numpy_of_torch(path: str, data: bytes, dtype: str, shape: list[int]) -> np.ndarray[Any, Any]:
    np_dtype = _NUMPY_OF_TORCH.get(dtype)
    if np_dtype is None:
        raise NeedsTorch(path, dtype)
    return np.frombuffer(data, dtype=np_dtype).reshape(shape).copy()
