"""Unpickling that can only build plain data, in bounded memory and time.

Two guards, both needed:

* `RestrictedUnpickler` resolves only the globals of an allow-list, each to a plain stand-in
  (never the real class), and refuses persistent ids unless the caller maps them: a pickle can
  call nothing else, so it runs no code (`UnsafePickle`).
* `scan` reads the opcode stream first, without building anything, and refuses a pickle whose
  unpickling would cost more than the limits (`formats.limits`): opcodes (`MAX_PICKLE_OPS`),
  an estimate of the memory what it builds takes (`MAX_PICKLE_BUILD_BYTES`: each opcode counted
  at its worst case, e.g. a dict entry with its share of the table's growth), memo indexes
  (`MAX_PICKLE_MEMO`: the C unpickler allocates twice the highest index at once), one string
  or bytes value (`MAX_PICKLE_STRING_BYTES`), one integer (`MAX_PICKLE_INT_BYTES`). Opcodes no
  supported format writes (sets, extension codes, ``INST``/``OBJ``, out-of-band buffers) are
  refused. Without it, 64 MiB of ``EMPTY_DICT, APPEND`` cost ~3 GB to unpickle, and a 6-byte
  ``LONG_BINPUT`` with index 2**30 makes the unpickler allocate 16 GiB for its memo.

The C unpickler then runs on exactly the bytes that were scanned, stopping at the same
``STOP``: the scan's opcode boundaries are the ones it uses (framing only groups opcodes).
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections.abc import Callable
from typing import Any

from ckpt_ha.formats import limits


class UnsafePickle(Exception):
    """The pickle asks for something the format never holds: treat it as hostile."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"pickle asks for {what}, which this format never holds")


class MalformedPickle(Exception):
    """Not a pickle, a pickle past the limits, or one without the format's shape."""


# -- the scan -------------------------------------------------------------------------------

# How each opcode's argument is laid out (pickletools' descriptions of the grammar).
_FIXED, _LINE, _TWO_LINES, _LEN1, _LEN4, _LEN4U, _LEN8U = range(7)
_STRINGS = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
     "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"}
)  # fmt: skip
_UNICODE = frozenset({"UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"})
_INTS = frozenset({"LONG1", "LONG4"})
_MEMO_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_REFUSED = {
    "EXT1": "an extension code",
    "EXT2": "an extension code",
    "EXT4": "an extension code",
    "INST": "an INST instance",
    "OBJ": "an OBJ instance",
    "NEXT_BUFFER": "an out-of-band buffer",
    "READONLY_BUFFER": "an out-of-band buffer",
    "BYTEARRAY8": "a bytearray",
    "EMPTY_SET": "a set",
    "ADDITEMS": "a set",
    "FROZENSET": "a frozenset",
    "PERSID": "a text persistent id",
}
"""Opcodes no format ckpt-ha reads writes (protocols 2-5 of torch and DCP): refused unread."""

# Worst-case bytes each opcode adds to what the unpickler holds (CPython 3.11, 64-bit),
# measured and rounded up: a dict entry with its share of the table's growth, an object
# built by a stand-in with its attribute dict, a container, a pointer on the stack. A call
# (REDUCE, NEWOBJ) can only reach a stand-in of an allow-list, and every stand-in builds
# something of bounded size (at most a few fields, a path or shape of bounded length): that
# is what makes one price per call an upper bound.
_COST = {
    "EMPTY_DICT": 96, "EMPTY_LIST": 80, "EMPTY_TUPLE": 8, "TUPLE1": 80, "TUPLE2": 88,
    "TUPLE3": 96, "NONE": 8, "NEWTRUE": 8, "NEWFALSE": 8, "INT": 40, "BININT": 40,
    "BININT1": 40, "BININT2": 40, "LONG": 40, "FLOAT": 32, "BINFLOAT": 32, "GET": 8,
    "BINGET": 8, "LONG_BINGET": 8, "DUP": 8, "GLOBAL": 8, "STACK_GLOBAL": 8, "REDUCE": 160,
    "NEWOBJ": 128, "NEWOBJ_EX": 160, "BUILD": 96, "BINPERSID": 160, "APPEND": 16,
    "SETITEM": 96, "MARK": 8, "FRAME": 0,
}  # fmt: skip
_PER_ITEM = {"APPENDS": 16, "LIST": 16, "TUPLE": 8, "SETITEMS": 48, "DICT": 48}
"""Per stack item a MARK-ed opcode consumes (SETITEMS/DICT: per key and per value)."""


def _layout(op: pickletools.OpcodeInfo) -> tuple[int, int]:
    arg = op.arg
    if arg is None:
        return _FIXED, 0
    if arg.name == "stringnl_noescape_pair":
        return _TWO_LINES, 0
    kinds = {
        pickletools.UP_TO_NEWLINE: _LINE,
        pickletools.TAKEN_FROM_ARGUMENT1: _LEN1,
        pickletools.TAKEN_FROM_ARGUMENT4: _LEN4,
        pickletools.TAKEN_FROM_ARGUMENT4U: _LEN4U,
        pickletools.TAKEN_FROM_ARGUMENT8U: _LEN8U,
    }
    return (kinds[arg.n], 0) if arg.n < 0 else (_FIXED, arg.n)


def _stack_effect(op: pickletools.OpcodeInfo) -> tuple[bool, int]:
    """(consumes a MARK, net change of the stack not counting the MARK-ed slice)."""
    before = [x for x in op.stack_before if x is not pickletools.stackslice]
    marked = pickletools.markobject in before
    popped = len([x for x in before if x is not pickletools.markobject])
    pushed = len([x for x in op.stack_after if x is not pickletools.markobject])
    return marked, pushed - popped


_MAX_LINE = 4400
"""Longest text argument: a decimal integer of Python's 4,300 digits, a module or class name."""

_Spec = tuple[str, int, int, bool, int]
_TABLE: list[_Spec | None] = [None] * 256
_SIMPLE: list[tuple[int, int, int] | None] = [None] * 256
"""Opcodes with a fixed-size argument, no MARK and nothing else to track: (argument bytes,
cost, stack change); the scan's fast path (most of a real pickle's opcodes)."""
_PUT, _MARK, _MARKED, _TEXT = range(4)
_COMMON: list[tuple[int, int, int, int, bool] | None] = [None] * 256
"""The scan's second fast path, for the rest of a torch pickle's usual opcodes (memo puts,
MARK, the opcodes that gather a MARK-ed slice, short strings): (what, argument or length
bytes, cost or cost per item, stack change, unicode). Each is taken only when its argument is
all there and within the limits; otherwise the general path reads it, with its errors."""
for _op in pickletools.opcodes:
    _kind, _fixed = _layout(_op)
    _marked, _net = _stack_effect(_op)
    _code = ord(_op.code)
    _TABLE[_code] = (_op.name, _kind, _fixed, _marked, _net)
    if _kind == _FIXED and not _marked and _op.name in _COST and _op.name not in {"FRAME", "MARK"}:
        _SIMPLE[_code] = (_fixed + 1, _COST[_op.name], _net)
    elif _op.name in ("BINPUT", "LONG_BINPUT"):
        _COMMON[_code] = (_PUT, _fixed, 0, _net, False)
    elif _op.name == "MARK":
        _COMMON[_code] = (_MARK, 0, _COST["MARK"], _net, False)
    elif _marked and _kind == _FIXED and _fixed == 0 and _op.name not in _REFUSED:
        _base = _COST.get(_op.name, 0)
        assert _base == 0, _op.name  # the gathering opcodes cost per item only
        _COMMON[_code] = (_MARKED, 0, _PER_ITEM.get(_op.name, 8), _net, False)
    elif _op.name in _STRINGS and _kind in (_LEN1, _LEN4U):
        _COMMON[_code] = (_TEXT, 1 if _kind == _LEN1 else 4, 80, _net, _op.name in _UNICODE)


def scan(data: bytes, start: int = 0, budget: list[int] | None = None) -> int:
    """Check the pickle at ``data[start:]`` against the limits without building anything;
    return where it ends (after its STOP). ``budget`` ([estimated bytes left]) is shared by
    consecutive pickles of one file. `UnsafePickle` for a refused opcode, `MalformedPickle`
    for a limit passed or bytes that are no pickle.
    """
    left = budget if budget is not None else [limits.MAX_PICKLE_BUILD_BYTES]
    limit = left[0]
    n = len(data)
    pos = start
    ops = cost = depth = 0
    memo_top = -1
    memo_len = 0
    marks: list[int] = []
    simple, common_ops = _SIMPLE, _COMMON
    max_ops = limits.MAX_PICKLE_OPS
    max_memo, max_string = limits.MAX_PICKLE_MEMO, limits.MAX_PICKLE_STRING_BYTES
    while True:
        if pos >= n:
            raise MalformedPickle("the pickle ends before its STOP")
        code = data[pos]
        fast = simple[code]
        ops += 1
        if fast is not None:
            width, price, net = fast
            pos += width
            cost += price
            depth += net
            if cost > limit or ops > max_ops:
                _over(cost, limit, ops, pos)
            continue
        common = common_ops[code]
        if common is not None:
            what, width, price, net, wide_ok = common
            at = pos + 1 + width  # past the opcode and its argument (or its length)
            if at <= n and depth + net >= 0:  # the simple path leaves underflows to this test
                if what == _PUT:
                    index = int.from_bytes(data[pos + 1 : at], "little")
                    if index <= max_memo:
                        memo_len += 1
                        if index > memo_top:
                            cost += 16 * (index - memo_top)
                            memo_top = index
                        pos = at
                        if cost > limit or ops > max_ops:
                            _over(cost, limit, ops, pos)
                        continue
                elif what == _MARK:
                    marks.append(depth)
                    cost += price
                    pos = at
                    if cost > limit or ops > max_ops:
                        _over(cost, limit, ops, pos)
                    continue
                elif what == _MARKED:
                    if marks and (items := depth - marks[-1]) >= 0 and depth - items + net >= 0:
                        marks.pop()
                        cost += items * price
                        depth += net - items
                        pos = at
                        if cost > limit or ops > max_ops:
                            _over(cost, limit, ops, pos)
                        continue
                else:  # _TEXT
                    size = int.from_bytes(data[pos + 1 : at], "little")
                    end = at + size
                    if end <= n and size <= max_string:
                        wide = wide_ok and not data[at:end].isascii()
                        cost += price + (4 * size if wide else size)
                        depth += net
                        pos = end
                        if cost > limit or ops > max_ops:
                            _over(cost, limit, ops, pos)
                        continue
        spec = _TABLE[code]
        if spec is None:
            raise MalformedPickle(
                f"not a readable pickle: unknown opcode {code:#04x} at byte {pos}"
            )
        name, kind, fixed, marked, net = spec
        pos += 1
        if name in _REFUSED:
            raise UnsafePickle(f"{_REFUSED[name]} (opcode {name})")
        # The argument.
        arg_at, arg_len = pos, fixed
        if kind in (_LINE, _TWO_LINES):
            for _ in range(2 if kind == _TWO_LINES else 1):
                end = data.find(b"\n", pos, pos + _MAX_LINE)
                if end < 0:
                    raise MalformedPickle(f"{name} at byte {arg_at - 1}: no end of line nearby")
                pos = end + 1
            arg_len = pos - arg_at
        elif kind != _FIXED:
            width = {_LEN1: 1, _LEN4: 4, _LEN4U: 4, _LEN8U: 8}[kind]
            if pos + width > n:
                raise MalformedPickle(f"{name} at byte {arg_at - 1}: truncated")
            arg_len = int.from_bytes(data[pos : pos + width], "little", signed=kind == _LEN4)
            pos += width
            if arg_len < 0:
                raise MalformedPickle(f"{name} at byte {arg_at - 1}: negative length")
            arg_at = pos
            pos += arg_len
        else:
            pos += fixed
        if pos > n:
            raise MalformedPickle(f"{name} at byte {arg_at - 1}: truncated")
        # What building it costs.
        if name in _STRINGS:
            if arg_len > limits.MAX_PICKLE_STRING_BYTES:
                raise MalformedPickle(
                    f"a {arg_len}-byte string (limit {limits.MAX_PICKLE_STRING_BYTES})"
                )
            wide = name in _UNICODE and not data[arg_at : arg_at + arg_len].isascii()
            cost += 80 + (4 * arg_len if wide else arg_len)
        elif name in _INTS:
            if arg_len > limits.MAX_PICKLE_INT_BYTES:
                raise MalformedPickle(
                    f"a {arg_len}-byte integer (limit {limits.MAX_PICKLE_INT_BYTES})"
                )
            cost += 40 + arg_len
        elif name in _MEMO_PUT or name == "MEMOIZE":
            if name == "MEMOIZE":
                index = memo_len
            elif kind == _LINE:
                index = _line_int(data[arg_at : pos - 1], name)
            else:
                index = int.from_bytes(data[arg_at:pos], "little")
            if index > limits.MAX_PICKLE_MEMO:
                raise MalformedPickle(f"memo index {index} (limit {limits.MAX_PICKLE_MEMO})")
            memo_len += 1
            if index > memo_top:
                cost += 16 * (index - memo_top)  # the memo array, grown to twice the index
                memo_top = index
        elif name == "FRAME":
            cost += int.from_bytes(data[arg_at:pos], "little")  # the frame's own buffer
        else:
            cost += _COST.get(name, 0)
        # The stack, to price what a MARK-ed opcode gathers.
        if name == "MARK":
            marks.append(depth)
        elif marked:
            if not marks:
                raise MalformedPickle(f"{name} at byte {arg_at - 1} without a MARK")
            items = depth - marks.pop()
            if items < 0:
                raise MalformedPickle(f"{name} at byte {arg_at - 1}: the stack underflows")
            cost += items * _PER_ITEM.get(name, 8)
            depth -= items
        depth += net
        if depth < 0:
            raise MalformedPickle(f"{name} at byte {arg_at - 1}: the stack underflows")
        if cost > limit or ops > max_ops:
            _over(cost, limit, ops, pos)
        if name == "STOP":
            left[0] -= cost
            return pos


def _over(cost: int, limit: int, ops: int, pos: int) -> None:
    if ops > limits.MAX_PICKLE_OPS:
        raise MalformedPickle(f"more than {limits.MAX_PICKLE_OPS} opcodes (the limit)")
    raise MalformedPickle(
        f"building it would take more than {limit} bytes (limit "
        f"{limits.MAX_PICKLE_BUILD_BYTES}; the estimate passed it at opcode {ops}, byte {pos})"
    )


def _line_int(text: bytes, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise MalformedPickle(f"{name}: {text[:40]!r} is not an index") from None


# -- the unpickler ----------------------------------------------------------------------------


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals in ``allowed``; anything else is `UnsafePickle`.

    Every way a pickle names a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, the EXT opcodes) goes
    through `find_class`, and persistent ids go to ``persistent`` (refused when None), so
    nothing outside ``allowed`` can be reached, let alone called by REDUCE/NEWOBJ/BUILD.
    """

    def __init__(
        self,
        stream: io.BytesIO,
        allowed: dict[tuple[str, str], object],
        persistent: Callable[[object], object] | None = None,
    ) -> None:
        super().__init__(stream)
        self._allowed = allowed
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise UnsafePickle(f"global {module}.{name}") from None

    def persistent_load(self, pid: object) -> object:
        if self._persistent is None:
            raise UnsafePickle("a persistent id (external object)")
        return self._persistent(pid)


def restricted_loads(
    data: bytes,
    allowed: dict[tuple[str, str], object],
    persistent: Callable[[object], object] | None = None,
) -> object:
    """Scan, then unpickle the pickle in ``data`` with only ``allowed`` globals;
    `UnsafePickle` or `MalformedPickle` for anything else."""
    [value] = restricted_loads_many(data, allowed, persistent, count=1)
    return value


def restricted_loads_many(
    data: bytes,
    allowed: dict[tuple[str, str], object],
    persistent: Callable[[object], object] | None = None,
    *,
    count: int,
) -> list[object]:
    """The ``count`` consecutive pickles at the start of ``data`` (a legacy torch file holds
    five before its raw tensor bytes), scanned then unpickled; the limits hold for all of them
    together."""
    if len(data) > limits.MAX_PICKLE_BYTES:
        raise MalformedPickle(f"{len(data)} bytes (limit {limits.MAX_PICKLE_BYTES})")
    budget = [limits.MAX_PICKLE_BUILD_BYTES]
    end = 0
    for _ in range(count):
        end = scan(data, end, budget)
    stream = io.BytesIO(data[:end])
    try:
        unpickler = RestrictedUnpickler(stream, allowed, persistent)
        return [unpickler.load() for _ in range(count)]
    except (UnsafePickle, MalformedPickle):
        raise
    # The unpickler fails on hostile bytes with many exception types (UnpicklingError, EOFError,
    # ValueError, TypeError, KeyError for a bad memo, ...): all mean "not readable".
    except Exception as exc:  # noqa: BLE001
        raise MalformedPickle(f"not a readable pickle ({type(exc).__name__})") from None
