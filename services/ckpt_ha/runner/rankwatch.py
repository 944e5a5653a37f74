"""The first rank of a torchrun group to die, seen by the runner itself (issue 28).

When one rank of a group dies, torchrun notices it (its agent polls every ``--monitor-interval``,
0.1 s), ends the other ranks, prints its report and exits; only then did the runner see
anything. On a loaded host that took 8-9 s (torch's shutdown, the other rank's termination, the
interpreter's exit), against 0.8 s idle. The runner reads torchrun's children itself instead:
every ``every_s`` it lists them (``/proc/<pid>/task/*/children``), learns each one's rank from
its environment (``RANK``) and reads its state. A rank that is a zombie (dead, not yet reaped by
torchrun) holding a signal in its exit status (``/proc/<pid>/stat`` field 52) is the group's
first failure: the runner reports it at once (`ckpt_ha.runner.adapter.ExitInfo` with
``group_running``) and then stops the rest.

Only a death by a signal is taken early: it is the one whose cause is complete in the exit
status (a rank killed by SIGKILL leaves no message anywhere). A rank that exits with an error
code has its exception in torchrun's report (the error file, its ``[rankN]:`` lines), so the
runner still waits for torchrun then. A zombie torchrun reaped before the runner read it (the
window is torchrun's monitor interval) is missed: the runner then sees the group end as before.
"""

from __future__ import annotations

import contextlib
import signal as signals
from dataclasses import dataclass, field
from pathlib import Path

EVERY_S = 0.02
"""How often the runner reads the ranks' states (a few small ``/proc`` reads each time)."""


@dataclass(frozen=True)
class RankDeath:
    """A rank torchrun has not reaped yet, ended by ``signal``."""

    pid: int
    rank: int | None
    signal: int


def exit_signal(stat: str) -> int | None:
    """The signal that ended a zombie, from its ``/proc/<pid>/stat`` text; None when the
    process is not a zombie, exited normally or the kernel does not show the status."""
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    try:
        status = int(fields[49])  # field 52 (exit_code), counted from field 3 (state)
    except ValueError:
        return None
    sig = status & 0x7F
    return sig if sig and sig != 0x7F else None


def rank_of(environ: bytes) -> int | None:
    """``RANK`` from a process's ``/proc/<pid>/environ``."""
    for item in environ.split(b"\0"):
        if item.startswith(b"RANK="):
            with contextlib.suppress(ValueError):
                return int(item[5:])
    return None


@dataclass
class RankWatch:
    """torchrun's children, read from ``/proc`` (``root`` in tests)."""

    torchrun_pid: int
    root: Path = Path("/proc")
    ranks: dict[int, int | None] = field(default_factory=dict)
    """pid → rank of every child seen so far."""

    def _children(self) -> list[int]:
        found: list[int] = []
        for children in (self.root / str(self.torchrun_pid) / "task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                found.extend(int(child) for child in children.read_text().split())
        return found

    def poll(self) -> RankDeath | None:
        """The first rank seen dead by a signal, if one is now."""
        children = self._children()  # a zombie is listed until torchrun reaps it
        for pid in children:
            if self.ranks.get(pid) is None:
                # read again until known: between fork and exec a child shows torchrun's own
                # environment (no RANK), and a zombie shows none
                try:
                    self.ranks[pid] = rank_of((self.root / str(pid) / "environ").read_bytes())
                except OSError:
                    self.ranks[pid] = None
        for pid in children:
            try:
                stat = (self.root / str(pid) / "stat").read_text()
            except OSError:
                continue
            sig = exit_signal(stat)
            if sig is not None:
                return RankDeath(pid, self.ranks.get(pid), sig)
        return None


def describe(death: RankDeath) -> str:
    try:
        name = signals.Signals(death.signal).name
    except ValueError:
        name = f"signal {death.signal}"
    who = f"rank {death.rank}" if death.rank is not None else f"a rank (pid {death.pid})"
    return f"{who} ended by {name}"
