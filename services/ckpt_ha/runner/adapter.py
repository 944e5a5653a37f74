"""How the runner starts, waits for and stops one attempt of a training command.

`SchedulerAdapter` is the port; `LocalProcess` is the embedded default (a child process on this
machine), `ckpt_ha.runner.slurm.SlurmBatch` submits each attempt as a Slurm batch job. An adapter
implements three calls: ``start`` creates the Job / submits the batch job with the given
environment, ``wait`` blocks until it ended and says how (exit code, signal, OOM kill, last error
line, for a torchrun group the rank that failed, and for a scheduler the final state it reported),
``kill`` forwards a signal to it. docs/SCHEDULERS.md is the contract in words.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal as signals
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from ckpt_ha.runner import rankwatch
from ckpt_ha.runner.torchrun import (
    ERROR_FILE_ENV,
    ErrorRecord,
    RankFailure,
    max_restarts,
    parse_error_file,
    rank_failure,
)

log = logging.getLogger("ckpt_ha.runner")
LAST_LINE_CHARS = 500
STDERR_TAIL_LINES = 200
"""Enough of the end of stderr to hold torchrun's root-cause section (it is printed last)."""
ERROR_FILE_BYTES = 1 << 20
"""A larger error file is not torchrun's (its tracebacks are kilobytes): it is ignored."""


@dataclass(frozen=True)
class ExitInfo:
    """How one attempt ended, as the scheduler saw it."""

    exit_code: int | None
    """The process's exit status; None when it was ended by a signal."""
    signal: int | None = None
    oom_killed: bool = False
    """The kernel's OOM killer ended a process of the attempt (cgroup ``oom_kill`` grew)."""
    last_error_line: str = ""
    """The last non-empty line the command wrote on stderr (for the failure signature)."""
    rank: RankFailure | None = None
    """The command was a torchrun group and this rank's failure ended it."""
    state: str | None = None
    """The scheduler's final state of the attempt (Slurm's ``JobState``: ``COMPLETED``,
    ``NODE_FAIL``, ``PREEMPTED``, ``CANCELLED``, ``FAILED``...); None for a local process."""
    reason: str = ""
    """The scheduler's reason beside ``state`` (Slurm's ``Reason``, e.g. ``NodeDown``)."""
    reported_by: str = "runner"
    """Who saw the end (``job.failed``'s ``reported_by``): the runner, or the scheduler."""
    group_running: bool = False
    """A torchrun group's first rank died (``rank``) and torchrun still runs: the runner saw
    the death itself (`ckpt_ha.runner.rankwatch`); it reports the failure, then stops the rest
    and waits for the attempt's end (``wait`` again) before anything is relaunched."""

    @property
    def succeeded(self) -> bool:
        ok_state = self.state is None or self.state == "COMPLETED"
        return self.exit_code == 0 and self.signal is None and ok_state


class SchedulerAdapter(Protocol):
    """One attempt at a time: start it, wait for its end, signal it meanwhile."""

    def start(self, command: Sequence[str], env: Mapping[str, str]) -> str:
        """Launch ``command`` with exactly ``env``; return the scheduler's handle for it
        (a pid, a Kubernetes Job name, a Slurm job id), printed for operators."""
        ...

    def wait(self) -> ExitInfo:
        """Block until the attempt ended; safe to call from a worker thread."""
        ...

    def kill(self, sig: int = signals.SIGTERM) -> None:
        """Send ``sig`` to the running attempt (no-op when none runs)."""
        ...

    def stop(self, grace_s: float) -> None:
        """End every process of the running attempt for good (a hung attempt): a polite
        signal, then after ``grace_s`` one nothing survives. Returns once asked; ``wait`` says
        when the attempt is gone. No-op when none runs."""
        ...


def memory_events(cgroup_root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """This process's cgroup v2 ``memory.events`` file, if there is one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = cgroup_root / line[3:].lstrip("/") / "memory.events"
            return path if path.exists() else None
    return None


def oom_kills(events: Path | None) -> int | None:
    """The ``oom_kill`` counter of a ``memory.events`` file (None when unreadable)."""
    if events is None:
        return None
    try:
        for line in events.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


class LocalProcess:
    """The embedded adapter: the command as a child process of the runner.

    The child gets its own session, so a Ctrl-C in the terminal reaches it once, through the
    runner's forwarding, not twice. Its stderr is copied through line by line (the last lines
    are kept for the failure signature and torchrun's root-cause section); stdout is inherited
    untouched. When ``env`` names a torchrun error file, a failed attempt's file is read.
    """

    def __init__(
        self,
        memory_events_file: Path | None = None,
        stderr: IO[bytes] | None = None,
        *,
        watch_ranks: bool = False,
    ) -> None:
        self._watch_ranks = watch_ranks
        """Watch a torchrun group's ranks (`ckpt_ha.runner.rankwatch`): `ckpt-ha run` does;
        off, ``wait`` returns when torchrun has ended the group and exited."""
        self._events = memory_events_file if memory_events_file is not None else memory_events()
        self._stderr = stderr if stderr is not None else sys.stderr.buffer
        self._proc: subprocess.Popen[bytes] | None = None
        self._copier: threading.Thread | None = None
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._error_file: str | None = None
        self._oom_before: int | None = None
        self._ranks: rankwatch.RankWatch | None = None
        """A torchrun group without restarts of its own: its ranks, watched while it runs."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, command: Sequence[str], env: Mapping[str, str]) -> str:
        self._oom_before = oom_kills(self._events)
        self._tail.clear()
        self._error_file = env.get(ERROR_FILE_ENV) or None
        self._proc = subprocess.Popen(
            list(command), env=dict(env), stderr=subprocess.PIPE, start_new_session=True
        )
        assert self._proc.stderr is not None
        self._copier = threading.Thread(target=self._copy, args=(self._proc.stderr,), daemon=True)
        self._copier.start()
        # torchrun without restarts of its own: it ends the group on a rank's death.
        watch = self._watch_ranks and max_restarts(command, env) == 0
        self._ranks = rankwatch.RankWatch(self._proc.pid) if watch else None
        return str(self._proc.pid)

    def _copy(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            try:
                self._stderr.write(raw)
                self._stderr.flush()
            except (OSError, ValueError):
                pass  # our own stderr is gone; keep draining so the child never blocks
            text = raw.decode(errors="replace").strip()
            if text:
                self._tail.append(text[-LAST_LINE_CHARS:])
        stream.close()

    def wait(self) -> ExitInfo:
        if self._proc is None:
            raise RuntimeError("wait() before start()")
        early = self._first_rank_death()
        if early is not None:
            return early
        code = self._proc.wait()
        if self._copier is not None:
            self._copier.join(timeout=5)
        grew = self._oom_grew()
        last = self._tail[-1] if self._tail else ""
        if code < 0:
            return ExitInfo(None, -code, grew, last)
        rank = None
        if code != 0:
            rank = rank_failure(tuple(self._tail), read_error_file(self._error_file))
        return ExitInfo(code, None, grew, last, rank)

    def _oom_grew(self) -> bool:
        after = oom_kills(self._events)
        return after is not None and self._oom_before is not None and after > self._oom_before

    def _first_rank_death(self) -> ExitInfo | None:
        """Until the command ends: a torchrun group's first rank to die by a signal, seen
        before torchrun reaps it (`ckpt_ha.runner.rankwatch`); None once the command ended
        (or when it is no such group). Watches once per attempt: a second ``wait`` waits."""
        watch, self._ranks = self._ranks, None
        proc = self._proc
        if watch is None or proc is None:
            return None
        while proc.poll() is None:
            death = watch.poll()
            if death is not None:
                log.info("%s while torchrun runs: reporting it now", rankwatch.describe(death))
                rank = RankFailure(death.rank, None, death.signal)
                return ExitInfo(None, None, self._oom_grew(), "", rank, group_running=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=rankwatch.EVERY_S)
        return None

    def kill(self, sig: int = signals.SIGTERM) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to every process of the attempt, SIGKILL to what is left after ``grace_s``.
        Every process: the command's process group (it runs in its own session) and each of
        its descendants, found through ``/proc`` before anything is signalled (torchrun starts
        each rank in a session of its own, and a rank whose torchrun died is re-parented, so
        neither the group nor the tree afterwards finds it). A rank stuck in a collective or a
        stopped (SIGSTOP) one dies too."""
        proc = self._proc
        if proc is None:
            return
        tree = process_tree(proc.pid)
        _signal_group(proc.pid, signals.SIGTERM)
        signal_all(tree, signals.SIGTERM)
        signal_all(tree, signals.SIGCONT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        tree |= process_tree(proc.pid)  # started meanwhile (a restarting torchrun)
        _signal_group(proc.pid, signals.SIGKILL)
        signal_all(tree, signals.SIGKILL)


Process = tuple[int, str]
"""A pid with its start time (``/proc/<pid>/stat`` field 22): a pid reused since is not it."""


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def process_tree(pid: int) -> set[Process]:
    """``pid`` and all its descendants now (``/proc/<pid>/task/*/children``), with their start
    times; empty when ``pid`` is gone."""
    found: set[Process] = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        started = _start_time(current)
        if started is None or (current, started) in found:
            continue
        found.add((current, started))
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(child) for child in children.read_text().split())
    return found


def signal_all(tree: set[Process], sig: int) -> None:
    """``sig`` to every process of ``tree`` still the same process (its start time)."""
    for pid, started in tree:
        if _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def read_error_file(path: str | None) -> ErrorRecord | None:
    """A torchrun error file's report of the failed rank; None when there is none, or (logged)
    when it cannot be read, is larger than `ERROR_FILE_BYTES` or holds no such report."""
    if path is None:
        return None
    try:
        with open(path, "rb") as stream:
            data = stream.read(ERROR_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("ignoring the torchrun error file %s: %s", path, exc.strerror or exc)
        return None
    if len(data) > ERROR_FILE_BYTES:
        log.warning("ignoring the torchrun error file %s: over %d bytes", path, ERROR_FILE_BYTES)
        return None
    recorded = parse_error_file(data.decode(errors="replace"))
    if recorded is None:  # also a plain command's own ``@record`` report: not worth a warning
        log.info("ignoring the torchrun error file %s: no failed rank's report in it", path)
    return recorded
