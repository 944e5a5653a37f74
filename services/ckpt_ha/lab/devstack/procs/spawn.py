"""Starting a process detached and waiting until it is ready.

Processes are spawned detached (their own session, stdin from /dev/null, stdout and stderr
appended to ``<home>/logs/<name>.log``) so they outlive the launcher, and are described by a
`ManagedProcess` that serialises to JSON for a state file."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_ha.lab.devstack.procs.errors import ProcessStartFailed
from ckpt_ha.lab.devstack.procs.liveness import (
    KILL_WAIT,
    POLL_INTERVAL,
    exit_text,
    marker_of,
    read_cmdline,
    read_stat,
    reap,
)
from ckpt_ha.lab.devstack.procs.ports import LOCALHOST, PORT_TAKEN, accepts_tcp, port_is_free
from ckpt_ha.runtime.local_stack import ManagedProcess

DEFAULT_START_TIMEOUT = 15.0
_LOG_TAIL_LINES = 30


def _log_tail(log_path: Path, offset: int) -> str:
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])


def _spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path, lock_fd: int | None) -> int:
    # posix_spawn rather than Popen: nothing in this process needs a Popen object, and dropping
    # one for a child that is meant to outlive us triggers ResourceWarnings. Exit statuses are
    # collected by reap when we happen to be the parent.
    actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    if lock_fd is not None:
        # dup2 onto another number clears close-on-exec in the child only, so the lock goes
        # with the server and no concurrently spawned process inherits it by accident.
        actions.append((os.POSIX_SPAWN_DUP2, lock_fd, 3 if lock_fd != 3 else 4))
    return os.posix_spawn(argv[0], list(argv), dict(env), file_actions=actions, setsid=True)


def _take_lock(lock: Path) -> int | None:
    """An fd holding an exclusive flock on ``lock``; None if a live process already holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def start_process(
    name: str,
    argv: list[str],
    *,
    home: Path,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    url: str | None = None,
    http_port: int | None = None,
    marker: str | None = None,
    ready: Callable[[], bool] | None = None,
    lock: Path | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
) -> ManagedProcess:
    """Launch ``argv`` detached and wait until it is ready.

    ``argv[0]`` must be a path to an executable. ``env`` is laid over the current environment.
    Output goes to ``home/logs/<name>.log`` (appended, so restarts keep history). Readiness is
    ``ready()`` if given, else "``port`` accepts TCP connections" if a port is given; with
    neither, the process is returned as soon as it is spawned. ``port`` and ``http_port`` must be
    free beforehand, so a fast probe can never be answered by some other server on that port.
    ``lock`` is a file the process holds an exclusive flock on for its whole life (the kernel
    drops it when the process dies, however it dies): a second process for the same data
    directory is refused instead of corrupting it. Raises :class:`ProcessStartFailed` (with the
    log of this run) when the process exits or is not ready within ``timeout`` seconds; a
    process that timed out is killed.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    log_path = home / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0

    def failed(reason: str) -> ProcessStartFailed:
        return ProcessStartFailed(name, reason, _log_tail(log_path, offset))

    for taken in (p for p in (port, http_port) if p is not None):
        if not port_is_free(taken):
            raise failed(f"port {LOCALHOST}:{taken} {PORT_TAKEN}")

    lock_fd = None
    if lock is not None:
        lock_fd = _take_lock(lock)
        if lock_fd is None:
            raise failed(f"{lock} is locked: another live process uses this data directory")
    full_env = {**os.environ, **(env or {})}
    try:
        pid = _spawn(argv, full_env, log_path, lock_fd)
    except OSError as exc:
        raise failed(f"cannot execute {argv[0]}: {exc.strerror or exc}") from exc
    finally:
        if lock_fd is not None:
            os.close(lock_fd)  # the child holds the lock now

    stat = read_stat(pid)
    proc = ManagedProcess(
        name=name,
        pid=pid,
        port=port or 0,
        url=url if url is not None else (f"tcp://{LOCALHOST}:{port}" if port else ""),
        log_path=log_path,
        http_port=http_port,
        marker=marker if marker is not None else Path(argv[0]).name,
        start_ticks=None if stat is None else stat[1],
    )
    probe = ready
    if probe is None and port:
        tcp_port = port
        probe = lambda: accepts_tcp(tcp_port)  # noqa: E731 - a one-line default probe
    if probe is None:
        return proc

    # Until we reap it the pid is our child and cannot be recycled: in here waitpid tells
    # exactly whether it still runs, and signalling it by pid is safe.
    try:
        _await_ready(proc, probe, timeout, failed)
    except ProcessStartFailed:
        raise
    except BaseException:
        _kill_child(pid)  # the probe raised, or Ctrl-C: leave nothing behind
        raise
    return proc


def _await_ready(
    proc: ManagedProcess,
    probe: Callable[[], bool],
    timeout: float,
    failed: Callable[[str], ProcessStartFailed],
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        exited, code = reap(proc.pid)
        if exited:
            raise failed(f"{exit_text(code)} before it became ready")
        if probe():
            if marker_of(proc) in read_cmdline(proc.pid):
                return
            exited, code = reap(proc.pid)  # it may have died right after answering
            if exited:
                raise failed(f"{exit_text(code)} right after it became ready")
            _kill_child(proc.pid)
            lacks = marker_of(proc)
            raise failed(f"its command line lacks {lacks!r}, so it could never be stopped")
        if time.monotonic() >= deadline:
            _kill_child(proc.pid)
            raise failed(f"not ready after {timeout:g}s")
        time.sleep(POLL_INTERVAL)


def _kill_child(pid: int) -> None:
    """SIGKILL and reap a child we have not reaped yet (so its pid cannot have been recycled)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT
    while not reap(pid)[0] and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (it may name or hash secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
