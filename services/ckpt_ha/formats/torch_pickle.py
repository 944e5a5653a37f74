"""The pickle inside a ``torch.save`` file, checked by the restricted unpickler at any size.

A torch file's tensors are raw bytes; what can run code is its pickle. ``torch.save`` (since
PyTorch 1.6) writes a zip: ``<archive>/data.pkl`` (the object tree, tensors as persistent ids
naming ``<archive>/data/<key>``), then the tensor bytes. Only the zip's directory and its
``data.pkl`` are read here, so the check costs the same for 1 KiB and for 100 GiB, and no size
ever skips it. A legacy file (a bare pickle stream: magic number, protocol, system info, the
object, its storage keys, then raw bytes) has its five pickles read from its start.

The allow-list is torch's own for ``torch.load(weights_only=True)`` (tensor rebuild functions,
storage types, dtypes, ``torch.Size``, ``torch.device``, ``collections.OrderedDict``, ...), plus
the numpy array globals a Hugging Face Trainer's ``rng_state*.pth`` needs. Each name resolves
to an inert stand-in that keeps nothing (the values are not needed to judge safety), so no
call can build anything large; any other global, and any opcode no torch writes, is unsafe.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from ckpt_ha.formats import limits, restricted_pickle
from ckpt_ha.formats.report import Verdict
from ckpt_ha.formats.restricted_pickle import MalformedPickle, UnsafePickle
from ckpt_ha.storage import ObjectStore

ZIP_MAGIC = b"PK\x03\x04"
PICKLE_MAGIC = b"\x80"
LEGACY_PICKLES = 5
"""magic number, protocol version, system info, the object, the storage keys."""


class _Inert:
    """What every allowed global stands for, and what calling it returns: callable, accepts
    any BUILD state, keeps nothing."""

    __slots__ = ()

    def __call__(self, *args: object, **kwargs: object) -> _Inert:
        return self

    def __setstate__(self, state: object) -> None:
        return None


class _Mapping(dict[Any, Any]):
    """``OrderedDict()``: SETITEMS fill it, BUILD may set its ``_metadata`` (ignored)."""

    def __setstate__(self, state: object) -> None:
        return None


def _ordered_dict(*args: object) -> _Mapping:
    if args and args != ((),) and args != ([],):
        raise MalformedPickle("OrderedDict built from arguments")  # torch never does
    return _Mapping()


INERT = _Inert()
_STORAGES = (
    "Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
    "ComplexDouble", "ComplexFloat", "QUInt8", "QInt8", "QInt32", "QUInt4x2", "QUInt2x4",
    "Untyped", "Typed",
)  # fmt: skip
_DTYPES = (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128",
    "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "bool",
    "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bcomplex32", "bits8", "bits16",
    "bits1x8", "bits2x4", "bits4x2", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    *(f"int{n}" for n in range(1, 8)), *(f"uint{n}" for n in range(1, 8)),
)  # fmt: skip
_REBUILD = (
    "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
    "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor",
)  # fmt: skip
_TENSORS = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
_QSCHEMES = (
    "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
    "per_channel_affine_float_qparams",
)  # fmt: skip

ALLOWED: dict[tuple[str, str], object] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("collections", "Counter"): INERT,
    ("torch.nn.parameter", "Parameter"): INERT,
    ("torch.serialization", "_get_layout"): INERT,
    ("torch", "Size"): INERT,
    ("torch", "Tensor"): INERT,
    ("torch", "device"): INERT,
    ("_codecs", "encode"): INERT,
    ("builtins", "bytearray"): INERT,
    ("builtins", "set"): INERT,
    ("builtins", "complex"): INERT,
    ("torch._tensor", "_rebuild_from_type_v2"): INERT,
    **{("torch._utils", name): INERT for name in _REBUILD},
    **{("torch", name): INERT for name in _DTYPES},
    **{("torch", name): INERT for name in _QSCHEMES},
    **{("torch", f"{kind}Storage"): INERT for kind in _STORAGES},
    **{("torch.cuda", f"{kind}Storage"): INERT for kind in _STORAGES},
    **{("torch.storage", f"{kind}Storage"): INERT for kind in ("Untyped", "Typed")},
    **{("torch", f"{kind}Tensor"): INERT for kind in _TENSORS},
    **{("torch.cuda", f"{kind}Tensor"): INERT for kind in _TENSORS},
}
"""torch's weights-only allow-list (torch 2.x ``_weights_only_unpickler``), by name."""

NUMPY_RNG: dict[tuple[str, str], object] = {
    **ALLOWED,
    ("numpy.core.multiarray", "_reconstruct"): INERT,
    ("numpy._core.multiarray", "_reconstruct"): INERT,
    ("numpy", "ndarray"): INERT,
    ("numpy", "dtype"): INERT,
    **{("numpy.dtypes", f"{kind}DType"): INERT for kind in ("UInt32", "Float64", "Int64")},
}
"""What the Hugging Face Trainer itself allows when loading ``rng_state*.pth``."""


READ_WINDOW = 64 * 1024
"""Bytes `RangeReader` fetches at once: a torch zip's directory sits in the last such window
(its end records with it) and its ``data.pkl`` in the first, so the zip is opened and its
pickle read in about two reads instead of a dozen small ones."""


class RangeReader(io.RawIOBase):
    """A seekable file over ``length`` bytes of an object from ``offset``, reading through the
    store on demand, a window of up to `READ_WINDOW` bytes around what is asked at a time, and
    at most ``budget`` bytes in all: a zip is opened without its data."""

    def __init__(self, store: ObjectStore, key: str, offset: int, length: int, budget: int):
        super().__init__()
        self.store, self.key, self.offset, self.length = store, key, offset, length
        self.position = 0
        self.budget = budget
        self._window = b""
        self._window_at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.length - self.position)
        if want <= 0:
            return 0
        at = self.position - self._window_at
        if at < 0 or at + want > len(self._window):
            self._fetch(want)
            at = self.position - self._window_at
        data = self._window[at : at + want]
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)

    def _fetch(self, want: int) -> None:
        """Read the window holding [position, position + want): up to `READ_WINDOW` bytes,
        reaching back from the position near the end (where a zip's directory is read
        backwards from its end record), never more than the budget left."""
        end = min(self.length, self.position + max(want, READ_WINDOW))
        start = max(0, min(self.position, end - READ_WINDOW))
        if end - start > self.budget:
            start, end = self.position, self.position + want  # no more than asked
        self.budget -= end - start
        if self.budget < 0:
            raise MalformedPickle(
                f"reading its pickle would read more than the limit of "
                f"{limits.MAX_TORCH_ZIP_DIRECTORY_BYTES + limits.MAX_PICKLE_BYTES} bytes"
            )
        self._window = self.store.read_bytes(
            self.key, offset=self.offset + start, length=end - start
        )
        self._window_at = start


def check(
    store: ObjectStore,
    key: str,
    name: str,
    *,
    offset: int = 0,
    length: int,
    numpy_rng: bool = False,
) -> tuple[Verdict, str] | None:
    """None when every pickle of the torch file at ``key`` (``length`` bytes from ``offset``)
    holds only allowed globals; else (unsafe or corrupt, reason). Reads its zip directory and
    pickles only (at most `limits.MAX_TORCH_ZIP_DIRECTORY_BYTES` + `limits.MAX_PICKLE_BYTES`).
    """
    allowed = NUMPY_RNG if numpy_rng else ALLOWED
    budget = limits.MAX_TORCH_ZIP_DIRECTORY_BYTES + limits.MAX_PICKLE_BYTES
    reader = RangeReader(store, key, offset, length, budget)
    try:
        head = reader.read(4)
        if head.startswith(ZIP_MAGIC):
            pickles, names = _zip_pickles(reader)
            for member, data in pickles:
                storages: set[str] = set()
                restricted_pickle.restricted_loads(data, allowed, _storage_ids(storages))
                _check_storages(member, storages, names)
        elif head.startswith(PICKLE_MAGIC):
            reader.seek(0)
            data = reader.read(min(length, limits.MAX_PICKLE_BYTES))
            restricted_pickle.restricted_loads_many(
                data, allowed, _legacy_storage, count=LEGACY_PICKLES
            )
        else:
            return Verdict.CORRUPT, f"{name}: neither a torch zip container nor a pickle"
    except UnsafePickle as exc:
        return Verdict.UNSAFE, f"{name}: refused by the restricted unpickler: {exc}"
    except MalformedPickle as exc:
        return Verdict.CORRUPT, f"{name}: not loadable: {exc}"
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError) as exc:
        return Verdict.CORRUPT, f"{name}: not loadable: its zip is unreadable ({exc})"
    return None


def _zip_pickles(reader: RangeReader) -> tuple[list[tuple[str, bytes]], set[str]]:
    """Every ``*.pkl`` member (torch reads ``<archive>/data.pkl``; an archive holding two is
    checked whole), each at most `limits.MAX_PICKLE_BYTES`; and every member's name."""
    reader.seek(0)
    with zipfile.ZipFile(reader) as archive:
        infos = archive.infolist()
        members = [i for i in infos if i.filename.endswith(".pkl")]
        if not any(i.filename.endswith("data.pkl") for i in members):
            raise MalformedPickle("a torch zip without a data.pkl")
        pickles = []
        for info in members:
            if info.file_size > limits.MAX_PICKLE_BYTES:
                raise MalformedPickle(
                    f"{info.filename} is {info.file_size} bytes (limit {limits.MAX_PICKLE_BYTES})"
                )
            with archive.open(info) as member:
                data = member.read(limits.MAX_PICKLE_BYTES + 1)
            if len(data) > limits.MAX_PICKLE_BYTES:
                raise MalformedPickle(f"{info.filename}: more than {limits.MAX_PICKLE_BYTES}")
            pickles.append((info.filename, data))
    return pickles, {i.filename for i in infos}


def _storage_ids(found: set[str]) -> Any:
    def load(pid: object) -> object:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsafePickle("a persistent id that is not a torch storage")
        if not isinstance(pid[2], str) or len(pid[2]) > 100:
            raise MalformedPickle("a storage key that is not a short string")
        found.add(pid[2])
        return INERT

    return load


def _legacy_storage(pid: object) -> object:
    if not (isinstance(pid, tuple) and pid and pid[0] in ("storage", "module")):
        raise UnsafePickle("a persistent id that is not a torch storage")
    if pid[0] == "module":  # legacy whole-module saves carry source code: never loaded
        raise UnsafePickle("a pickled module (its source code)")
    return INERT


def _check_storages(member: str, storages: set[str], names: set[str]) -> None:
    """Every storage the pickle names is a member of its archive (``<archive>/data/<key>``)."""
    archive = member.rsplit("/", 1)[0]
    missing = sorted(k for k in storages if f"{archive}/data/{k}" not in names)
    if missing:
        raise MalformedPickle(f"{member} names storage {missing[0]!r}, which the archive lacks")
