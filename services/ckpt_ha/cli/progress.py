"""Progress on long work (`verify`, `latest-valid`, `registry rebuild`, `reconcile`), for people.

It goes to stderr, and only when stderr is a terminal or `--progress` asks for it: stdout keeps
the result alone, so `--json` output stays one document and a pipe or a log file gets nothing
unasked. On a terminal one line is rewritten in place and cleared at the end; asked for with
`--progress` elsewhere, it is a plain line at most every few seconds and one when the work ends.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Lock
from typing import TextIO

from ckpt_ha.cli import render


class Progress:
    """One piece of long work; call it with ``(done, total)`` from any thread."""

    def __init__(
        self,
        label: str,
        unit: str,
        stream: TextIO,
        *,
        tty: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.unit, self.stream, self.tty, self.clock = label, unit, stream, tty, clock
        self.every_s = 0.1 if tty else 2.0
        self.done = 0
        self.total: int | None = None
        self._shown_at: float | None = None
        self._lock = Lock()

    def __call__(self, done: int, total: int | None = None, unit: str | None = None) -> None:
        """``unit``: work of several phases names the phase's (e.g. "jobs read", "deleted");
        a new phase always shows."""
        with self._lock:
            new_phase = unit is not None and unit != self.unit
            self.done, self.total = done, total
            self.unit = unit or self.unit
            now = self.clock()
            if not new_phase and self._shown_at is not None and now - self._shown_at < self.every_s:
                return
            self._shown_at = now
            self._show()

    def text(self, *, finished: bool = False) -> str:
        amount = render.size if self.unit == "bytes" else str
        if finished:
            return f"{self.label}: done, {amount(self.done)} {self._noun()}"
        if self.total is None:
            return f"{self.label}: {amount(self.done)} {self._noun()}"
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return f"{self.label}: {amount(self.done)} of {amount(self.total)} {self._noun()}{share}"

    def _noun(self) -> str:
        return "read" if self.unit == "bytes" else self.unit

    def _show(self) -> None:
        if self.tty:
            self.stream.write(f"\r{self.text()}\x1b[K")
        else:
            self.stream.write(self.text() + "\n")
        self.stream.flush()

    def close(self, *, finished: bool = True) -> None:
        """``finished``: the work ended normally (an error prints its own line)."""
        with self._lock:
            if self.tty:
                if self._shown_at is not None:  # the result then prints on a clean line
                    self.stream.write("\r\x1b[K")
            elif finished:
                self.stream.write(self.text(finished=True) + "\n")
            self.stream.flush()


def wanted(args: argparse.Namespace, stream: TextIO) -> bool:
    """`--progress`, or stderr a terminal."""
    return bool(getattr(args, "progress", False)) or stream.isatty()


@contextmanager
def reporting(args: argparse.Namespace, label: str, unit: str) -> Iterator[Progress | None]:
    """A `Progress` on stderr when `wanted`, else None (the operation then reports nothing)."""
    stream = sys.stderr
    if not wanted(args, stream):
        yield None
        return
    progress = Progress(label, unit, stream, tty=stream.isatty())
    try:
        yield progress
    except BaseException:
        progress.close(finished=False)
        raise
    progress.close()
