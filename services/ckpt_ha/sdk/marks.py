"""Per-rank progress marks: what the runner's hang detection reads (issue 28).

Each process of an attempt under a runner keeps one small file beside the runner's progress
file, ``<progress file>.rank<R>`` (`mark_path`), holding one JSON object (`Mark`): the last step
it reported (`ckpt_ha.sdk.progress`), when (its own clock, used for step intervals only) and
the slow phase it is in, if any: a checkpoint save (`ckpt_ha.sdk.save`, `ckpt_ha.sdk.dcp`), an
evaluation (the Hugging Face callback), or anything the training code marks itself with
`slow_phase`. The runner treats silence inside a slow phase as legitimate
(`ckpt_ha.runner.hang`). Files, not events: the runner polls them on its own host once a second
without any bus, and a rank's process going away leaves its last mark for the failure report.

Writing a mark never raises (a full disk must not end a training step); it is replaced
atomically, so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from ckpt_ha.sdk.protocol import Context, context

log = logging.getLogger("ckpt_ha.sdk")
P = ParamSpec("P")
R = TypeVar("R")
MAX_MARK_BYTES = 4096
PHASES = ("save", "eval", "load", "other")
"""The slow phases a mark names (anything else is recorded as ``other``)."""


@dataclass(frozen=True)
class Mark:
    """One rank's last word: its last reported step and the slow phase it is in."""

    step: int | None
    at: float
    """When the step was reported (the rank's clock, seconds since the epoch): intervals
    between two steps of the same rank are measured on it, never compared with another clock."""
    phase: str | None = None
    """The slow phase the rank is in (`PHASES`); None: training."""

    def encode(self) -> str:
        return json.dumps({"step": self.step, "at": self.at, "phase": self.phase})


def mark_path(progress_file: str, rank: int) -> str:
    return f"{progress_file}.rank{rank}"


def parse(text: str) -> Mark | None:
    """A mark from a file's text; None for anything that is not one (never raises)."""
    try:
        doc = json.loads(text[:MAX_MARK_BYTES])
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    step, at, phase = doc.get("step"), doc.get("at"), doc.get("phase")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        return None
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    if phase is not None and phase not in PHASES:
        phase = "other"
    return Mark(step=step, at=float(at), phase=phase)


def read(path: str) -> Mark | None:
    """The mark at ``path``; None when there is none or it is not readable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return parse(stream.read(MAX_MARK_BYTES))
    except OSError:
        return None


class _Rank:
    """This process's mark (one per process: the SDK is used by one rank per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.step: int | None = None
        self.at = time.time()
        self.phases: list[str] = []

    def write(self, ctx: Context) -> None:
        if ctx.progress_file is None:
            return
        path = mark_path(ctx.progress_file, ctx.rank)
        phase = self.phases[-1] if self.phases else None
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                out.write(Mark(self.step, self.at, phase).encode())
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write the progress mark %s: %r", path, exc)


_RANK = _Rank()


def mark_step(step: int, *, ctx: Context | None = None) -> None:
    """This rank finished ``step``, for the runner's hang detection only (no event): what the
    ranks that do not report progress (`ckpt_ha.sdk.progress`, usually rank 0's) call each
    step, so a stall names the rank that stopped first. A no-op outside a runner."""
    ctx = ctx if ctx is not None else _quiet_context()
    if ctx is not None:
        stepped(ctx, step)


def stepped(ctx: Context, step: int) -> None:
    """The rank reached ``step`` (from `ckpt_ha.sdk.progress` or `mark_step`)."""
    if ctx.progress_file is None:
        return
    with _RANK.lock:
        _RANK.step, _RANK.at = step, time.time()
        _RANK.write(ctx)


def enter(phase: str, ctx: Context | None = None) -> None:
    """This rank enters a slow phase (`slow_phase` without a ``with``: a callback that sees the
    start and the end of a phase apart calls `enter` and `leave`)."""
    ctx = ctx if ctx is not None else _quiet_context()
    if ctx is None or ctx.progress_file is None:
        return
    with _RANK.lock:
        _RANK.phases.append(phase if phase in PHASES else "other")
        _RANK.write(ctx)


def leave(phase: str, ctx: Context | None = None) -> None:
    """This rank left the slow phase it entered (a phase it is not in: nothing happens)."""
    ctx = ctx if ctx is not None else _quiet_context()
    if ctx is None or ctx.progress_file is None:
        return
    with _RANK.lock:
        name = phase if phase in PHASES else "other"
        if name not in _RANK.phases:
            return
        _RANK.phases.remove(name)
        _RANK.write(ctx)


@contextlib.contextmanager
def slow_phase(phase: str, ctx: Context | None = None) -> Iterator[None]:
    """Mark the code inside as a legitimately slow phase (``save``, ``eval``, ``load`` or any
    other name, recorded as ``other``): the runner's hang detection does not count the time it
    takes. Nests; a no-op outside a runner.

    Use it around anything that takes far longer than a training step and reports no progress
    meanwhile (an evaluation loop, a data re-shuffle, a long synchronous upload)."""
    ctx = ctx if ctx is not None else _quiet_context()
    enter(phase, ctx)
    try:
        yield
    finally:
        leave(phase, ctx)


def during(phase: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: the whole call is a `slow_phase` (``ctx`` taken from the environment)."""

    def deco(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with slow_phase(phase):
                return fn(*args, **kwargs)

        return wrapper

    return deco


def _quiet_context() -> Context | None:
    """The attempt, or None when the environment does not describe one (a bad variable is the
    caller's own call to report, not a slow phase's)."""
    try:
        return context()
    except Exception:  # noqa: BLE001 - BadContext and friends: the save itself reports them
        return None
