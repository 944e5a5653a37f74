"""Loading torch-pickled bytes the only safe way: ``torch.load(weights_only=True)``.

torch is optional (the ``torch`` extra): it is imported lazily, on first use, and when it is
absent callers fall back to structural checks and say so in the report. The load is never done
without ``weights_only``: a pickle that needs a global outside torch's allow-list (a class with
a malicious ``__reduce__``, ``os.system``) is refused before anything runs and reported unsafe.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import pickle
from types import ModuleType
from typing import Any

from ckpt_ha.formats import limits
from ckpt_ha.formats.report import Verdict

MAX_LOAD_BYTES = limits.MAX_LOAD_BYTES
"""Larger files are not loaded (memory); their pickle is still checked (`torch_pickle`)."""

# How torch's weights-only unpickler words a refusal of content (as opposed to unreadable bytes).
_UNSAFE_MARKERS = (
    "GLOBAL ",
    "is blocked",
    "Can only",
    "unrecognized function",
    "persistent_load",
    "persistent id",
)


@functools.cache
def torch_module() -> ModuleType | None:
    """The torch module, or None when the ``torch`` extra is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def _numpy_rng_globals() -> list[Any]:
    """What the Hugging Face Trainer itself allows when loading ``rng_state*.pth``."""
    try:
        np = importlib.import_module("numpy")
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    return [
        core.multiarray._reconstruct,
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
        type(np.dtype(np.float64)),
    ]


def _first_line(exc: BaseException) -> str:
    """torch's own one-line reason, without its advice on how to load the file anyway."""
    text = str(exc).split("\n\nCheck the documentation", 1)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[-1].rsplit("WeightsUnpickler error:", 1)[-1].strip()[:300]


def check(data: bytes, name: str, *, numpy_rng: bool = False) -> tuple[Verdict, str] | None:
    """None when ``torch.load(weights_only=True)`` accepts ``data``, else (verdict, reason).

    Requires torch (see `torch_module`). ``numpy_rng`` also allows the numpy array globals the
    Trainer's RNG state needs, exactly as transformers' own loader does.
    """
    return _load(io.BytesIO(data), name, numpy_rng=numpy_rng, mmap=False)


def check_file(path: str, name: str, *, numpy_rng: bool = False) -> tuple[Verdict, str] | None:
    """`check` of a local file, loaded with ``mmap=True``: the same unpickler and the same
    archive records, the tensors left in the file's pages instead of copied out (a load
    without the file's bytes read twice more). The caller keeps the file from shrinking
    meanwhile (`storage.leased_map.leased_whole`). A legacy (non-zip) file cannot be mapped:
    it is loaded from its bytes."""
    with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
        if not zipped:
            return _load(io.BytesIO(f.read()), name, numpy_rng=numpy_rng, mmap=False)
    return _load(path, name, numpy_rng=numpy_rng, mmap=True)


def _load(
    source: str | io.BytesIO, name: str, *, numpy_rng: bool, mmap: bool
) -> tuple[Verdict, str] | None:
    torch = torch_module()
    if torch is None:
        raise RuntimeError("torch is not installed")
    allowed = _numpy_rng_globals() if numpy_rng else []
    context = torch.serialization.safe_globals(allowed) if allowed else contextlib.nullcontext()
    try:
        with context:
            torch.load(source, weights_only=True, map_location="cpu", mmap=mmap)
    except pickle.UnpicklingError as exc:
        reason = _first_line(exc)
        if any(marker in str(exc) for marker in _UNSAFE_MARKERS):
            return Verdict.UNSAFE, f"{name}: refused by torch.load(weights_only=True): {reason}"
        return Verdict.CORRUPT, f"{name}: not loadable: {reason}"
    # torch.load reports a damaged container as RuntimeError, EOFError, ValueError, ...
    except Exception as exc:  # noqa: BLE001
        first = _first_line(exc).split(". ", 1)[0]
        return Verdict.CORRUPT, f"{name}: not loadable ({type(exc).__name__}: {first})"
    return None
