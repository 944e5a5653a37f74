"""Reading a PyTorch DCP ``.metadata`` pickle without torch and without running its code.

PyTorch's own reader unpickles ``.metadata`` unrestricted, so a hostile file runs code on load.
Here a restricted unpickler (`restricted_pickle`: it also bounds the opcodes, the memory and the
memo a pickle may use) resolves ONLY the globals the DCP writer emits (found by
disassembling real torch 2.13 checkpoints with pickletools), each to a plain stand-in defined
below: the metadata dataclasses (``Metadata``, ``TensorStorageMetadata``,
``BytesStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties``, ``MetadataIndex``,
``StorageMeta``, ``_MEM_FORMAT_ENCODING``), ``filesystem._StorageInfo``, ``torch.Size``,
``torch.<dtype>``, layouts (``torch.serialization._get_layout``), memory formats,
``pathlib`` paths (as strings) and ``collections.OrderedDict``. Any other global (``os.system``,
``builtins.eval``, an unknown class) raises `UnsafeMetadata` before anything is called, so a
``REDUCE`` can only ever call one of these stand-ins. The stand-ins accept only their declared
fields. Pure: bytes in, plain data out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ckpt_ha.formats import limits, restricted_pickle

MAX_METADATA_BYTES = limits.MAX_METADATA_BYTES


UnsafeMetadata = restricted_pickle.UnsafePickle
"""The pickle asks for something a DCP writer never emits: treat it as hostile."""
MalformedMetadata = restricted_pickle.MalformedPickle
"""Not a pickle, past a limit, or a pickle that does not have the shape of DCP metadata."""


# -- stand-ins -------------------------------------------------------------------------------


class _Record:
    """A dataclass-like stand-in, built by NEWOBJ + BUILD(dict). Only its declared fields are
    kept; other string keys (a field a newer torch added) are dropped, never set."""

    FIELDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        if len(args) > len(self.FIELDS):
            raise MalformedMetadata(f"{type(self).__name__}: too many arguments")
        self.__setstate__({**dict(zip(self.FIELDS, args, strict=False)), **kwargs})

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]  # (None, slotstate): a frozen dataclass with slots
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise MalformedMetadata(f"{type(self).__name__}: unexpected state")
        for key in self.FIELDS:
            object.__setattr__(self, key, state.get(key))

    def get(self, key: str) -> Any:
        return self.__dict__.get(key)


class MetadataRecord(_Record):
    FIELDS = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class TensorStorageRecord(_Record):
    FIELDS = ("properties", "size", "chunks")


class BytesStorageRecord(_Record):
    FIELDS = ()


class ChunkRecord(_Record):
    FIELDS = ("offsets", "sizes")


class MetadataIndexRecord(_Record):
    FIELDS = ("fqn", "offset", "index")


class StorageInfoRecord(_Record):
    FIELDS = ("relative_path", "offset", "length", "transform_descriptors")


class StorageMetaRecord(_Record):
    FIELDS = ("checkpoint_id", "save_id", "load_id", "modules")


class TensorPropertiesRecord(_Record):
    """Pickled as a 5-tuple by TensorProperties.__getstate__."""

    FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) == len(self.FIELDS):
            state = dict(zip(self.FIELDS, state, strict=True))
        super().__setstate__(state)


class _Sealed:
    """Shared by every load, so BUILD (which would set attributes) must fail on it."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise MalformedMetadata(f"BUILD on {type(self).__name__}")


@dataclass(frozen=True)
class DType(_Sealed):
    name: str
    itemsize: int | None
    """Bytes per element, None for sub-byte and packed dtypes."""


@dataclass(frozen=True)
class Named(_Sealed):
    """A torch layout or memory format, kept by name."""

    kind: str
    name: str


class _Call(_Sealed):
    """A stand-in function, wrapped so a pickle cannot set attributes on the function."""

    __slots__ = ("_fn",)
    _fn: Callable[..., object]

    def __init__(self, fn: Callable[..., object]) -> None:
        object.__setattr__(self, "_fn", fn)

    def __setattr__(self, name: str, value: object) -> None:
        raise MalformedMetadata("attribute set on a stand-in function")

    def __call__(self, *args: object) -> object:
        return self._fn(*args)


_DTYPES: dict[str, int | None] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
    "complex32": 4, "complex64": 8, "complex128": 16,
    "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": None, "quint2x4": None,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"int{n}": None for n in range(1, 8)}, **{f"uint{n}": None for n in range(1, 8)},
}  # fmt: skip
_LAYOUTS = frozenset(
    ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn",
     "jagged"]
)  # fmt: skip
_MEMORY_FORMATS = ("contiguous_format", "channels_last", "preserve_format", "channels_last_3d")
_MEM_FORMAT_ENCODING = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}


def _size(dims: object = ()) -> tuple[int, ...]:
    if (
        not isinstance(dims, tuple | list)
        or len(dims) > limits.MAX_TENSOR_DIMS
        or not all(
            type(d) is int and d >= 0
            for d in dims  # bool is not a dimension
        )
    ):
        raise MalformedMetadata("torch.Size of something other than non-negative ints")
    return tuple(dims)


def _layout(name: object) -> Named:
    if not isinstance(name, str) or name.removeprefix("torch.") not in _LAYOUTS:
        raise MalformedMetadata("unknown torch layout")
    return Named("layout", name.removeprefix("torch."))


def _mem_format_encoding(value: object) -> Named:
    if type(value) is not int or value not in _MEM_FORMAT_ENCODING:
        raise MalformedMetadata("unknown memory format encoding")
    return Named("memory_format", _MEM_FORMAT_ENCODING[value])


def _path(*parts: object) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise MalformedMetadata("path of something other than strings")
    if sum(len(str(p)) + 1 for p in parts) > _MAX_PATH:
        raise MalformedMetadata(f"a path longer than {_MAX_PATH} characters")
    return "/".join(str(p) for p in parts)


_MAX_PATH = 4096
"""A stand-in builds nothing larger than its inputs by much: the unpickler's memory estimate
(`restricted_pickle`) prices each call once, so a path rebuilt from one memoized string a
million times must not be a million copies of it."""


def _ordered_dict(items: object = ()) -> dict[object, object]:
    if items == ():
        return {}
    raise MalformedMetadata("OrderedDict built from arguments")


_DCP = "torch.distributed.checkpoint.metadata"
ALLOWED: dict[tuple[str, str], object] = {
    (_DCP, "Metadata"): MetadataRecord,
    (_DCP, "TensorStorageMetadata"): TensorStorageRecord,
    (_DCP, "BytesStorageMetadata"): BytesStorageRecord,
    (_DCP, "ChunkStorageMetadata"): ChunkRecord,
    (_DCP, "TensorProperties"): TensorPropertiesRecord,
    (_DCP, "MetadataIndex"): MetadataIndexRecord,
    (_DCP, "StorageMeta"): StorageMetaRecord,
    (_DCP, "_MEM_FORMAT_ENCODING"): _Call(_mem_format_encoding),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfoRecord,
    ("torch", "Size"): _Call(_size),
    ("torch.serialization", "_get_layout"): _Call(_layout),
    ("collections", "OrderedDict"): _Call(_ordered_dict),
    **{("torch", name): DType(name, size) for name, size in _DTYPES.items()},
    **{("torch", name): Named("layout", name) for name in _LAYOUTS},
    **{("torch", name): Named("memory_format", name) for name in _MEMORY_FORMATS},
    **{("torch._utils", f"torch.{name}"): Named("memory_format", name) for name in _MEMORY_FORMATS},
    **{
        (module, cls): _Call(_path)
        for module in ("pathlib", "pathlib._local")
        for cls in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")
    },
}


def restricted_loads(data: bytes, allowed: dict[tuple[str, str], object]) -> object:
    """Unpickle with only ``allowed`` globals, within the limits (`restricted_pickle`);
    `UnsafeMetadata` or `MalformedMetadata` else."""
    return restricted_pickle.restricted_loads(data, allowed)


# -- the plain result ------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageEntry:
    fqn: str
    chunk_offset: tuple[int, ...] | None
    relative_path: str
    """As written: the caller must check it stays inside the checkpoint."""
    offset: int
    length: int


@dataclass(frozen=True)
class Item:
    fqn: str
    kind: str
    """``tensor`` or ``bytes``."""
    dtype: DType | None = None
    size: tuple[int, ...] = ()
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    """(offsets, sizes) of each stored chunk."""


@dataclass(frozen=True)
class DcpMetadata:
    items: dict[str, Item]
    storage: tuple[StorageEntry, ...]
    version: str | None

    def needed_sizes(self, keep: Callable[[str], str | None]) -> dict[str, int]:
        """File → the least size holding every entry in it; ``keep`` maps or drops paths."""
        needed: dict[str, int] = {}
        for entry in self.storage:
            path = keep(entry.relative_path)
            if path is not None:
                needed[path] = max(needed.get(path, 0), entry.offset + entry.length)
        return needed


def _nonneg_int(value: object) -> bool:
    return type(value) is int and value >= 0


def parse(data: bytes) -> DcpMetadata:
    """The metadata's items and storage entries; raises `UnsafeMetadata`/`MalformedMetadata`."""
    if not data:
        raise MalformedMetadata("empty file")
    if len(data) > MAX_METADATA_BYTES:
        raise MalformedMetadata(f"larger than {MAX_METADATA_BYTES} bytes")
    root = restricted_loads(data, ALLOWED)
    if not isinstance(root, MetadataRecord):
        raise MalformedMetadata(f"top-level object is a {type(root).__name__}, not Metadata")
    state_dict = root.get("state_dict_metadata")
    storage_data = root.get("storage_data")
    if not isinstance(state_dict, dict):
        raise MalformedMetadata("state_dict_metadata is not a dict")
    if not isinstance(storage_data, dict):
        raise MalformedMetadata("storage_data is not a dict of storage entries")
    items = {}
    for fqn, spec in state_dict.items():
        if not isinstance(fqn, str):
            raise MalformedMetadata("a state_dict_metadata key is not a string")
        items[fqn] = _item(fqn, spec)
    storage = []
    for index, info in storage_data.items():
        storage.append(_entry(index, info))
    version = root.get("version")
    return DcpMetadata(items, tuple(storage), version if isinstance(version, str) else None)


def _item(fqn: str, spec: object) -> Item:
    if isinstance(spec, BytesStorageRecord):
        return Item(fqn, "bytes")
    if not isinstance(spec, TensorStorageRecord):
        raise MalformedMetadata(f"{fqn!r}: neither tensor nor bytes storage metadata")
    props, size, chunks = spec.get("properties"), spec.get("size"), spec.get("chunks")
    dtype = props.get("dtype") if isinstance(props, TensorPropertiesRecord) else None
    if not isinstance(dtype, DType):
        raise MalformedMetadata(f"{fqn!r}: tensor without a dtype")
    if not isinstance(size, tuple) or not isinstance(chunks, list):
        raise MalformedMetadata(f"{fqn!r}: tensor without size or chunks")
    spans = []
    for chunk in chunks:
        offsets = chunk.get("offsets") if isinstance(chunk, ChunkRecord) else None
        sizes = chunk.get("sizes") if isinstance(chunk, ChunkRecord) else None
        if not (
            isinstance(offsets, tuple)
            and isinstance(sizes, tuple)
            and len(offsets) == len(sizes) == len(size)
            and all(o + s <= d for o, s, d in zip(offsets, sizes, size, strict=True))
        ):
            raise MalformedMetadata(f"{fqn!r}: a chunk lies outside the tensor's {list(size)}")
        spans.append((offsets, sizes))
    return Item(fqn, "tensor", dtype, size, tuple(spans))


def _entry(index: object, info: object) -> StorageEntry:
    if not isinstance(index, MetadataIndexRecord) or not isinstance(index.get("fqn"), str):
        raise MalformedMetadata("a storage_data key is not a MetadataIndex")
    if not isinstance(info, StorageInfoRecord):
        raise MalformedMetadata(f"{index.get('fqn')!r}: storage entry is not a _StorageInfo")
    path, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
    chunk_offset = index.get("offset")
    if not isinstance(path, str) or not _nonneg_int(offset) or not _nonneg_int(length):
        raise MalformedMetadata(f"{index.get('fqn')!r}: storage entry lacks path/offset/length")
    if chunk_offset is not None and not isinstance(chunk_offset, tuple):
        raise MalformedMetadata(f"{index.get('fqn')!r}: storage key offset is not a torch.Size")
    return StorageEntry(index.get("fqn"), chunk_offset, path, offset, length)
