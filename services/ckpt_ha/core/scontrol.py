"""Slurm's ``scontrol show job|node -o`` records, read (pure: no I/O).

Shared by the Slurm scheduler adapter (`ckpt_ha.runner.slurm`) and the private test/drill
cluster (`ckpt_ha.lab.devstack.slurm`), which must read the same fields the same way.
"""

from __future__ import annotations

import re

__all__ = ["FINAL_STATES", "parse_exit_code", "parse_record"]

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")

FINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT",
})  # fmt: skip
"""Job states after which the job never runs again (``--no-requeue``). ``COMPLETING`` is not
one: the controller still deallocates, and shows the final state afterwards."""


def parse_record(line: str) -> dict[str, str]:
    """The fields of one ``scontrol show job|node -o`` line (``Key=value`` pairs; a value may
    hold spaces, as a ``Reason`` or a ``Command`` with arguments does)."""
    marks = list(_FIELD.finditer(line))
    record: dict[str, str] = {}
    ends = [mark.start() for mark in marks[1:]] + [len(line)]
    for mark, end in zip(marks, ends, strict=False):  # no marks, no fields
        record[mark[1]] = line[mark.end() : end].strip()
    return record


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """``ExitCode=E:S`` as (exit code, signal): ``0:9`` → (None, 9), killed by signal 9;
    ``3:0`` → (3, None); unreadable → (None, None)."""
    code, _, sig = text.partition(":")
    try:
        exit_code, signal = int(code), int(sig or 0)
    except ValueError:
        return None, None
    return (None, signal) if signal else (exit_code, None)
