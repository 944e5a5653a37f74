"""The one JSON parser every checkpoint-format reader uses: bounded, and failing one way.

Python's ``json`` raises ``JSONDecodeError`` for bad syntax but a plain ``ValueError`` for a
number of more than 4,300 digits and ``RecursionError`` for deep nesting, so a reader catching
only the first ended in a traceback (and the writer-watcher's whole scan with it). `parse`
raises `JsonInvalid` for every bad input, nests at most `limits.MAX_JSON_DEPTH` levels and
accepts what Python's writer emits (``NaN`` and ``Infinity`` appear in ``trainer_state.json``).
"""

from __future__ import annotations

import pydantic_core

from ckpt_ha.formats import limits

_BOM = b"\xef\xbb\xbf"


class JsonInvalid(ValueError):
    """Not a JSON document within the limits: not UTF-8, not JSON, too deep, a huge number."""


def parse(data: bytes) -> object:
    """The document in ``data``; `JsonInvalid` with the parser's reason for anything else."""
    try:
        return pydantic_core.from_json(data.removeprefix(_BOM), allow_inf_nan=True)
    except (ValueError, RecursionError) as exc:
        raise JsonInvalid(str(exc)[:200] or type(exc).__name__) from None


def count(value: object) -> int | None:
    """``value`` when it is a plain int in 0 .. `limits.MAX_SAFE_INT` (a step, a size), else
    None: a bool, a float or a number no event can carry is not a count."""
    if type(value) is int and 0 <= value <= limits.MAX_SAFE_INT:
        return value
    return None
