"""The restricted unpickler's bounds: hostile pickles are refused before anything is built,
the memory estimate is an upper bound of what unpickling really takes, and real DCP metadata
still reads.

Before the bounds, the unpickler had none: 64 MiB of ``EMPTY_DICT, APPEND`` cost ~3 GB, and a
6-byte ``LONG_BINPUT`` of a huge index made the C unpickler allocate its memo for it.
"""

from __future__ import annotations

import os
import pickle
import struct
import tracemalloc
from pathlib import Path

import pytest

from ckpt_ha.formats import dcp_metadata, limits, restricted_pickle
from ckpt_ha.formats.restricted_pickle import MalformedPickle, UnsafePickle

P4 = b"\x80\x04"


def _estimate(data: bytes) -> int:
    budget = [2**62]
    restricted_pickle.scan(data, 0, budget)
    return 2**62 - budget[0]


def _real_peak(data: bytes) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        value = restricted_pickle.restricted_loads(data, dcp_metadata.ALLOWED)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del value
    return peak


def _binint(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def _u(text: str) -> bytes:
    """SHORT_BINUNICODE of ``text``."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


N = 20_000
_RECORD = _u("torch.distributed.checkpoint.metadata") + _u("ChunkStorageMetadata") + b"\x93\x94"
_CHUNK = b"h\x00)\x81}(" + _u("offsets") + b"N" + _u("sizes") + b"Nub\x94a"
_SIZE = _u("torch") + _u("Size") + b"\x93\x94"
_SIZED = b"\x85\x85Ra"  # TUPLE1 (the dims), TUPLE1 (the args), REDUCE, APPEND
SHAPES: dict[str, bytes] = {
    "dicts in a list": P4 + b"]" + b"}a" * N + b".",
    "lists in a list": P4 + b"]" + b"]a" * N + b".",
    "tuples of ints": P4 + b"]" + b"".join(_binint(i) + b"\x85a" for i in range(N)) + b".",
    "a dict of int keys": P4 + b"}(" + b"".join(_binint(i) + b"N" for i in range(N)) + b"u.",
    "a dict via SETITEM": P4 + b"}" + b"".join(_binint(i) + b"Ns" for i in range(N)) + b".",
    "strings": P4 + b"]" + b"".join(_u(f"{i:08d}") + b"a" for i in range(N)) + b".",
    "wide strings": P4 + b"]" + b"".join(_u(f"é€😀{i}") + b"a" for i in range(N)) + b".",
    "memoized records": P4 + _RECORD + b"]" + _CHUNK * N + b".",
    "torch sizes": P4 + _SIZE + b"]" + b"".join(b"h\x00" + _binint(i) + _SIZED for i in range(N)),
    "long ints": P4 + b"]" + b"".join(b"\x8a\x20" + os.urandom(32) + b"a" for _ in range(N)) + b".",
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_estimate_bounds_what_unpickling_really_takes(shape: str) -> None:
    data = SHAPES[shape] if SHAPES[shape].endswith(b".") else SHAPES[shape] + b"."
    estimate, real = _estimate(data), _real_peak(data)
    assert real <= estimate, (shape, real, estimate)


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        (P4 + b"Nr\xff\xff\xff\x3f.", r"memo index 1073741823 \(limit"),
        (P4 + b"N\x94" * 3 + b"p99999999\n.", "memo index 99999999"),
        (P4 + b"\x8d" + struct.pack("<Q", 2**40) + b".", "truncated"),
        (P4 + b"\x8b" + struct.pack("<i", 2**20) + b"\x01" * 2**20 + b".", "integer"),
        (P4 + b"X" + struct.pack("<I", 17 * 2**20) + b"a" * (17 * 2**20) + b".", "string"),
        (P4 + b"]" + b"}a" * 100, "ends before its STOP"),
        (P4 + b"a.", "underflows"),
        (P4 + b"N" + b"e.", "without a MARK"),
        (P4 + b"\xfe.", "unknown opcode"),
        (P4 + b"Ittt" * 2000, "no end of line"),
        # The scan's fast paths (memo puts, MARK, TUPLE, short strings) judge these as before:
        (P4 + b"N\x8c\x05ab", "SHORT_BINUNICODE at byte 4: truncated"),
        (P4 + b"Nq", "BINPUT at byte 3: truncated"),
        (P4 + b"Nt.", "TUPLE at byte 3 without a MARK"),
        (P4 + b"a(N.", "MARK at byte 3: the stack underflows"),
        (P4 + b"aa\x8c\x01x.", "SHORT_BINUNICODE at byte 5: the stack underflows"),
    ],
    ids=["memo-index", "text-memo-index", "truncated", "huge-int", "huge-string", "no-stop",
         "underflow", "no-mark", "unknown-opcode", "endless-line", "short-string-truncated",
         "memo-put-truncated", "tuple-without-mark", "mark-after-underflow",
         "string-after-underflow"],
)  # fmt: skip
def test_past_a_limit_is_malformed(data: bytes, refusal: str) -> None:
    with pytest.raises(MalformedPickle, match=refusal):
        restricted_pickle.restricted_loads(data, dcp_metadata.ALLOWED)


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (P4 + b"\x82\x01.", "extension code"),
        (P4 + b"(ios\nsystem\n.", "INST"),
        (P4 + b"\x8f.", "a set"),
        (P4 + b"\x97.", "out-of-band buffer"),
        (P4 + b"Pid\n.", "persistent id"),
        (P4 + b"cos\nsystem\n\x8c\x02id\x85R.", r"global os\.system"),
        (P4 + b"N\x8c\x01xQ.", "persistent id"),
    ],
)
def test_what_no_format_writes_is_unsafe(data: bytes, what: str) -> None:
    with pytest.raises(UnsafePickle, match=what):
        restricted_pickle.restricted_loads(data, dcp_metadata.ALLOWED)


def test_too_many_opcodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_PICKLE_OPS", 1000)
    with pytest.raises(MalformedPickle, match="more than 1000 opcodes"):
        restricted_pickle.restricted_loads(P4 + b"N0" * 600 + b"N.", {})
    assert restricted_pickle.restricted_loads(P4 + b"N0" * 400 + b"N.", {}) is None


def test_a_path_stand_in_never_copies_a_string_without_bound() -> None:
    big = "p" * 10_000
    data = pickle.dumps(Path(big), protocol=4).replace(b"pathlib._local", b"pathlib")
    with pytest.raises(MalformedPickle, match="path longer than"):
        restricted_pickle.restricted_loads(data, dcp_metadata.ALLOWED)


"""64 MiB .metadata files (what the size limit lets through), and one of 8 bytes."""
