"""safetensors files, single and sharded, checked without loading any tensor.

Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data area. Every
tensor's ``data_offsets`` must lie in the data area, match dtype x shape, and the tensors must
tile the data area exactly. The file carries no checksum: the one computed here becomes the
reference later checks compare against.

How the library writes (``serialize_to_file``, safetensors 0.4-0.8): in place, no temp file and
no rename, in order: the 8-byte length, the header, then each tensor's bytes. A file is
therefore complete exactly when it is ``8 + N + the largest data_offsets end`` bytes long
(`declared_size`), and nothing else tells. A sharded set (transformers' ``save_pretrained``)
writes every ``<name>-NNNNN-of-NNNNN.safetensors`` shard first and the index last: shards
without their index are a save in progress, never a complete checkpoint.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import jsondoc, limits
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import InvalidKey, ObjectNotFound, ObjectStore

MAX_HEADER_BYTES = limits.MAX_SAFETENSORS_HEADER_BYTES  # the safetensors library's own limit
MAX_INDEX_BYTES = limits.MAX_INDEX_BYTES
INDEX_SUFFIX = ".safetensors.index.json"
SHARD_NAME = re.compile(r".+-\d{5}-of-\d{5}\.safetensors")
"""How transformers names the shards of a sharded save (the index names them too)."""

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def declared_size(store: ObjectStore, key: str, size: int) -> int | None:
    """The file's full size by its own header: 8 + header length + its last tensor's end.

    Reads the 8-byte length and the header only (bounded by `MAX_HEADER_BYTES`). None while
    the length or the header is not all there yet (the writer is still at it). A header that is
    all there but unreadable gives ``size``: more bytes will not make it valid, and verification
    says why.
    """
    if size < 8:
        return None
    (header_len,) = struct.unpack("<Q", store.read_bytes(key, offset=0, length=8))
    if header_len > MAX_HEADER_BYTES:
        return size
    if 8 + header_len > size:
        return None
    try:
        header = jsondoc.parse(store.read_bytes(key, offset=8, length=header_len))
    except jsondoc.JsonInvalid:
        return size
    if not isinstance(header, dict):
        return size
    ends: list[int] = []
    for name, spec in header.items():
        offsets = spec.get("data_offsets") if isinstance(spec, dict) else None
        if name == "__metadata__" or not isinstance(offsets, list) or len(offsets) != 2:
            continue
        end = jsondoc.count(offsets[1])
        if end is None:
            return size  # an end no file can reach: verification says why
        ends.append(end)
    return 8 + int(header_len) + max(ends, default=0)


def verify_file(
    store: ObjectStore,
    key: str,
    name: str,
    report: Report | None = None,
    algorithm: str = cs.DEFAULT_ALGORITHM,
) -> tuple[Report, set[str]]:
    """Check one file; returns the report and the tensor names its header declares."""
    report = report or Report(format=CheckpointFormat.SAFETENSORS)
    try:
        size = store.stat(key).size
    except ObjectNotFound:
        report.fail(Verdict.INCOMPLETE, f"{name}: missing")
        return report, set()
    except InvalidKey:
        report.fail(Verdict.UNSAFE, f"{name}: resolves outside the checkpoint (symlink?)")
        return report, set()
    if size < 8:
        report.fail(Verdict.CORRUPT, f"{name}: {size} bytes, too short for a header")
        return report, set()
    (header_len,) = struct.unpack("<Q", store.read_bytes(key, offset=0, length=8))
    if header_len > min(MAX_HEADER_BYTES, size - 8):
        report.fail(
            Verdict.CORRUPT, f"{name}: header length {header_len} does not fit a {size}-byte file"
        )
        return report, set()
    try:
        header = jsondoc.parse(store.read_bytes(key, offset=8, length=header_len))
    except jsondoc.JsonInvalid as exc:
        report.fail(Verdict.CORRUPT, f"{name}: header is not UTF-8 JSON ({exc})")
        return report, set()
    if not isinstance(header, dict):
        report.fail(Verdict.CORRUPT, f"{name}: header is not a JSON object")
        return report, set()
    tensors = _check_tensors(header, size - 8 - header_len, name, report)
    digest, read = cs.checksum(store, key, algorithm)
    report.bytes_read += read
    report.checksums[name] = digest
    return report, tensors


def _check_tensors(header: dict[str, Any], data_len: int, name: str, report: Report) -> set[str]:
    spans: list[tuple[int, int, str]] = []
    for tensor, spec in header.items():
        if tensor == "__metadata__":
            if not isinstance(spec, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in spec.items()
            ):
                report.fail(Verdict.CORRUPT, f"{name}: __metadata__ must map strings to strings")
            continue
        problem = _tensor_problem(spec, data_len)
        if problem is not None:
            report.fail(Verdict.CORRUPT, f"{name}: tensor {tensor!r}: {problem}")
            continue
        begin, end = spec["data_offsets"]
        spans.append((begin, end, tensor))
    position = 0
    for begin, end, tensor in sorted(spans):
        if begin != position:
            report.fail(
                Verdict.CORRUPT, f"{name}: tensor {tensor!r} starts at {begin}, expected {position}"
            )
            break
        position = end
    else:
        if position != data_len:
            report.fail(
                Verdict.CORRUPT, f"{name}: tensors cover {position} of {data_len} data bytes"
            )
    return {t for _, _, t in spans}


def _tensor_problem(spec: object, data_len: int) -> str | None:
    if not isinstance(spec, dict):
        return "not an object"
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        return f"unknown dtype {dtype!r}"
    if (
        not isinstance(shape, list)
        or len(shape) > limits.MAX_TENSOR_DIMS
        or not all(jsondoc.count(d) is not None for d in shape)
    ):
        return f"bad shape {_short(shape)}"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(jsondoc.count(o) is not None for o in offsets)
    ):
        return f"bad data_offsets {_short(offsets)}"
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        return f"data_offsets {offsets} outside the {data_len}-byte data area"
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != expected:
        return f"{end - begin} bytes for {dtype} x {shape} (expected {expected})"
    return None


def _short(value: object) -> str:
    """A value from a header, cut short: the header may hold megabytes in one field."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}..."


def verify_sharded(
    store: ObjectStore, prefix: str, index_name: str, algorithm: str = cs.DEFAULT_ALGORITHM
) -> Report:
    """A ``*.safetensors.index.json``: every shard present and valid, every mapped tensor in it."""
    report = Report(format=CheckpointFormat.SAFETENSORS)
    key = join(prefix, index_name)
    if store.stat(key).size > MAX_INDEX_BYTES:
        report.fail(Verdict.CORRUPT, f"{index_name}: larger than {MAX_INDEX_BYTES} bytes")
        return report
    try:
        index = jsondoc.parse(store.read_bytes(key))
    except jsondoc.JsonInvalid as exc:
        report.fail(Verdict.CORRUPT, f"{index_name}: not UTF-8 JSON ({exc})")
        return report
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        report.fail(Verdict.CORRUPT, f"{index_name}: no weight_map")
        return report
    wanted: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        path = inside(shard)
        if path is None:
            report.fail(Verdict.UNSAFE, f"{index_name}: {tensor!r} maps to {shard!r}, outside")
            return report
        wanted.setdefault(path, set()).add(tensor)
    for path, tensors in sorted(wanted.items()):
        _, declared = verify_file(store, join(prefix, path), path, report, algorithm)
        missing = tensors - declared
        if declared and missing:
            report.fail(
                Verdict.CORRUPT,
                f"{path}: lacks {len(missing)} indexed tensors, e.g. {min(missing)}",
            )
    if report.ok:
        report.checks += ["safetensors-index", "safetensors-header", "checksums-recorded"]
    return report


def verify_folder(
    store: ObjectStore, prefix: str, names: set[str], algorithm: str = cs.DEFAULT_ALGORITHM
) -> Report:
    """A folder of safetensors files: its index and shards, else every ``*.safetensors``."""
    report = Report(format=CheckpointFormat.SAFETENSORS)
    indexes = sorted(n for n in names if n.endswith(INDEX_SUFFIX))
    if len(indexes) > 1:
        report.fail(Verdict.CORRUPT, f"several index files: {indexes}")
        return report
    if indexes:
        return verify_sharded(store, prefix, indexes[0], algorithm)
    files = sorted(n for n in names if n.endswith(".safetensors"))
    shards = [n for n in files if SHARD_NAME.fullmatch(n)]
    if shards:
        report.fail(
            Verdict.INCOMPLETE,
            f"{shards[0]} is a shard of a sharded save but no *{INDEX_SUFFIX} names it: "
            "the index is written after the shards, so the save never finished",
        )
        return report
    for name in files:
        verify_file(store, join(prefix, name), name, report, algorithm)
    if report.ok:
        report.checks += ["safetensors-header", "checksums-recorded"]
    return report
