"""Is a recorded process still the one we started, and signalling it only then.

Every signal is preceded by an identity check against ``/proc/<pid>`` (start time and command
line), so a pid recorded yesterday and recycled by the kernel since is never signalled."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ckpt_ha.lab.devstack.procs.errors import ProcessNotRunning, ProcsError
from ckpt_ha.runtime.local_stack import ManagedProcess

POLL_INTERVAL = 0.05
KILL_WAIT = 5.0
_EXEC_WINDOW = 0.2


def read_stat(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time in clock ticks)`` from /proc/<pid>/stat, None if no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) is parenthesised and may itself contain spaces or parentheses.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def read_cmdline(pid: int) -> str:
    """The command line, space-joined; "" for no such pid (or a kernel thread).

    It also reads "" for a moment in the middle of every execve (the new program's arguments are
    recorded after the old address space is dropped), so an empty read is retried briefly before
    it is believed.
    """
    path = Path(f"/proc/{pid}/cmdline")
    deadline = time.monotonic() + _EXEC_WINDOW
    while True:
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return ""
        if raw or time.monotonic() >= deadline:
            return raw.replace(b"\0", b" ").decode(errors="replace").strip()
        time.sleep(0.001)


def reap(pid: int) -> tuple[bool, int | None]:
    """Collect the exit status of ``pid`` if it is our exited child (so no zombie lingers).

    Returns ``(exited, exit code)``: ``(False, None)`` while our child still runs, ``(True,
    None)`` when it is not (or no longer) our child, e.g. already reaped elsewhere. A negative
    code is the signal that killed it.
    """
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True, None
    if reaped != pid:
        return False, None
    return True, os.waitstatus_to_exitcode(status)


def exit_text(code: int | None) -> str:
    return "exited" if code is None else f"exited with code {code}"


def _thread_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


def marker_of(proc: ManagedProcess) -> str:
    return proc.marker or proc.name


def finished(proc: ManagedProcess) -> bool:
    """True once the process we started has exited (reaping it if it is our child).

    An exiting process drops its command line before it closes its sockets, so with a recorded
    start time only the start time is trusted here: a stop returns once the ports are free.
    """
    stat = read_stat(proc.pid)
    if stat is None or (proc.start_ticks is not None and stat[1] != proc.start_ticks):
        return True
    if stat[0] in ("Z", "X"):
        # A multithreaded process (nats-server is Go) shows its leader as a zombie while other
        # threads still exit, and its sockets stay open until the last one is gone: only a
        # completed reap, or an empty thread list for someone else's child, means finished.
        try:
            reaped, _ = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return _thread_count(proc.pid) <= 1
        return reaped == proc.pid
    if proc.start_ticks is None:
        return marker_of(proc) not in read_cmdline(proc.pid)
    return False


def is_alive(proc: ManagedProcess) -> bool:
    """True while the recorded pid is still the process we started (paused counts as alive).

    Both the start time (when recorded) and the command line must match, so a recycled pid
    never counts as alive and is never signalled.
    """
    return not finished(proc) and marker_of(proc) in read_cmdline(proc.pid)


def wait_gone(proc: ManagedProcess, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if finished(proc):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def signal_if_ours(proc: ManagedProcess, signum: signal.Signals) -> bool:
    """Send ``signum`` if the pid is still ours; False when there was nothing to signal."""
    if not is_alive(proc):
        return False
    try:
        os.kill(proc.pid, signum)
    except ProcessLookupError:
        return False
    return True


def stop(proc: ManagedProcess, *, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if still running after ``timeout`` seconds. Idempotent.

    Does nothing when the pid is gone or no longer ours. A paused process is continued right
    after the SIGTERM, otherwise the signal would stay pending until the timeout expired.
    """
    if not signal_if_ours(proc, signal.SIGTERM):
        return
    signal_if_ours(proc, signal.SIGCONT)
    if wait_gone(proc, timeout):
        return
    kill(proc)


def kill(proc: ManagedProcess) -> None:
    """SIGKILL without grace (crash drills) and wait until it is gone. Idempotent."""
    if not signal_if_ours(proc, signal.SIGKILL):
        return
    if not wait_gone(proc, KILL_WAIT):
        raise ProcsError(f"{proc.name} (pid {proc.pid}) survived SIGKILL for {KILL_WAIT}s")


def pause(proc: ManagedProcess) -> None:
    """SIGSTOP: the process keeps its sockets but answers nothing (an outage, not a crash)."""
    if not signal_if_ours(proc, signal.SIGSTOP):
        raise ProcessNotRunning(proc.name, proc.pid, "pause")


def resume(proc: ManagedProcess) -> None:
    """SIGCONT after :func:`pause`."""
    if not signal_if_ours(proc, signal.SIGCONT):
        raise ProcessNotRunning(proc.name, proc.pid, "resume")
