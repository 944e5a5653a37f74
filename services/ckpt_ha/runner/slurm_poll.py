"""One ``squeue`` per interval for every Slurm job a process waits on (issue 33).

Each `ckpt_ha.runner.slurm.SlurmBatch` used to ask ``scontrol show job`` about its own job every
0.5 s: at 10,000 jobs, 20,000 calls a second to slurmctld. Now the adapters of one process and
cluster share a `SlurmPoller` (`shared_poller`): it learns the state of every job they watch
from one ``squeue --jobs=<ids>`` per interval (ids in chunks of `CHUNK`, so that the argument
stays within the kernel's limit), asked by whichever waiter finds the last answer older than
the interval; the others read that answer. Only a job that squeue says ended (or no longer
lists) is asked about once more on its own, with ``scontrol show job``, for its exit code and
reason, as before.

A runner is one process per job, so the processes of one host share too, through a directory
(`share_dir`: ``CKPT_HA_SLURM_POLL_DIR``, else per user and cluster under ``$XDG_RUNTIME_DIR``
or ``/tmp``). Each process's poller registers the ids it waits on in a file of its own
(``waiting/<pid>.<token>``, removed when it waits on nothing; one of a dead pid is ignored and
removed). The answer is one file (``answer``, written to a temporary name and renamed):
whoever finds it older than the interval, or missing one of its jobs, takes ``lock``
(``flock``, non-blocking; the kernel releases it when its holder dies), reads the answer again,
and if still stale runs the one ``squeue`` of the union of the registered ids and writes it;
a process finding the lock held reads the previous answer and asks again later. A corrupt or
partial answer is no answer (polled anew). The clock is ``time.monotonic``: on Linux one clock
for every process of the host.

The commands go through a `Run` (`run_command` by default; a fake in the unit tests).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

POLL_S = 0.5
COMMAND_TIMEOUT_S = 30.0
CHUNK = 5000
"""Job ids per ``squeue`` call: 5,000 ids of up to 8 digits and a comma stay well within
Linux's 128 KiB limit on one argument."""
FORMAT = "%i|%T|%r"
"""Job id, state (extended: ``COMPLETED``, ``NODE_FAIL``...), reason."""
ABSENT = ("", "")
"""What `SlurmPoller.state` says of a job squeue did not list (ended and forgotten, or not
yet known): ask ``scontrol`` about it."""

DIR_ENV = "CKPT_HA_SLURM_POLL_DIR"
"""The directory the processes of a host share their ``squeue`` through (``off``: none)."""
ANSWER = "answer"
LOCK = "lock"
WAITING = "waiting"

Run = Callable[[Sequence[str], Mapping[str, str]], "subprocess.CompletedProcess[str]"]
"""Run one Slurm command (argv, environment) and return its completed process."""


def run_command(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`Run` through a subprocess, bounded by `COMMAND_TIMEOUT_S`."""
    return subprocess.run(
        list(argv),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def squeue_argv(binary: str, ids: Sequence[str]) -> list[str]:
    """One ``squeue`` asking for these jobs, finished ones included while slurmctld keeps them."""
    return [binary, "--noheader", "--states=all", f"--jobs={','.join(ids)}", f"--format={FORMAT}"]


def parse_squeue(out: str) -> dict[str, tuple[str, str]]:
    """Job id -> (state, reason) from `squeue_argv`'s output."""
    found: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3 and parts[0]:
            found[parts[0]] = (parts[1], parts[2])
    return found


class SlurmPoller:
    """The states of the jobs it watches, from one ``squeue`` per interval (thread-safe)."""

    def __init__(
        self,
        run: Run = run_command,
        *,
        env: Mapping[str, str] | None = None,
        interval_s: float = POLL_S,
        binary: str = "squeue",
        clock: Callable[[], float] = time.monotonic,
        share: Path | None = None,
        pid: int | None = None,
        alive: Callable[[int], bool] | None = None,
    ) -> None:
        """``share``: the directory shared with the other processes' pollers (None: this
        process only); ``pid``, ``alive``: this process's id and the test of another's
        (``os.getpid``, `pid_alive`; the unit tests stand several processes in one)."""
        self._run = run
        self._env = dict(env if env is not None else os.environ)
        self.interval_s = interval_s
        self._binary = binary
        self._clock = clock
        self._lock = threading.Lock()
        self._watched: set[str] = set()
        self._unseen: set[str] = set()
        self._states: dict[str, tuple[str, str]] = {}
        self._answered = True
        self._at = -math.inf
        self._asked: set[str] = set()
        self.calls = 0
        """``squeue`` calls made so far (what slurmctld was asked)."""
        self._share = share
        self._pid = os.getpid() if pid is None else pid
        self._alive = alive if alive is not None else pid_alive
        self._me = f"{self._pid}.{secrets.token_hex(6)}"
        if share is not None:
            share.mkdir(parents=True, exist_ok=True, mode=0o700)
            (share / WAITING).mkdir(exist_ok=True, mode=0o700)

    def watch(self, job_id: str) -> None:
        with self._lock:
            self._watched.add(job_id)
            self._unseen.add(job_id)
            self._register()

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._watched.discard(job_id)
            self._unseen.discard(job_id)
            self._states.pop(job_id, None)
            self._register()

    def _register(self) -> None:
        """This process's registration: the ids it waits on (none: no file)."""
        if self._share is None:
            return
        mine = self._share / WAITING / self._me
        with contextlib.suppress(OSError):  # unregistered: its own polls still cover its jobs
            if self._watched:
                write_atomic(mine, "".join(f"{i}\n" for i in sorted(self._watched)))
            else:
                mine.unlink(missing_ok=True)

    def state(self, job_id: str) -> tuple[str, str] | None:
        """The watched job's (state, reason) as of the latest ``squeue``, asked first when
        that is older than the interval or did not cover this job yet. `ABSENT`: squeue did
        not list it. None: squeue could not be asked (try again)."""
        with self._lock:
            if job_id in self._unseen or self._clock() - self._at >= self.interval_s:
                if self._share is None:
                    self._poll(sorted(self._watched))
                else:
                    calls = self.calls
                    try:
                        self._shared()
                    except OSError:  # the directory went away (a cleaner of /tmp): alone
                        if self.calls == calls:
                            self._poll(sorted(self._watched))
            if not self._answered or (self._share is not None and job_id not in self._asked):
                return None
            return self._states.get(job_id, ABSENT)

    def _shared(self) -> None:
        """The answer of the shared directory, polled first (under its lock) if stale."""
        assert self._share is not None
        if self._take(self._read()):
            return
        with _flock(self._share / LOCK) as held:
            if not held:  # another process is asking: its previous answer meanwhile
                self._take(self._read(), stale_ok=True)
                return
            if self._take(self._read()):  # written while we waited for the lock
                return
            ids = self._union()
            self._poll(ids)
            write_atomic(
                self._share / ANSWER, format_answer(self._at, self._answered, ids, self._states)
            )

    def _read(self) -> str | None:
        assert self._share is not None
        try:
            return (self._share / ANSWER).read_text()
        except (OSError, ValueError):
            return None  # none yet (or undecodable: polled anew)

    def _take(self, text: str | None, *, stale_ok: bool = False) -> bool:
        """Adopt the answer ``text`` if it is whole, fresh and covers every job watched here
        (``stale_ok``: its states whatever its age, still asking again next time)."""
        answer = parse_answer(text or "", self._watched)
        if answer is None:
            return False
        at, answered, states = answer
        fresh = self._clock() - at < self.interval_s and len(states) == len(self._watched)
        if not (fresh or stale_ok):
            return False
        self._answered, self._asked = answered, set(states)
        if answered:
            self._states = {i: s for i, s in states.items() if s != ABSENT}
        if fresh:
            self._at = at
            self._unseen.clear()
        return fresh

    def _union(self) -> list[str]:
        """The ids every live process's registration names (this one's included)."""
        assert self._share is not None
        ids = set(self._watched)
        for entry in (self._share / WAITING).iterdir():
            pid = entry.name.split(".", 1)[0]
            if entry.name.startswith(".") or not pid.isdigit():
                continue  # a registration being written
            if not self._alive(int(pid)):
                entry.unlink(missing_ok=True)  # its process died waiting
                continue
            with contextlib.suppress(OSError):
                ids.update(line for line in entry.read_text().split() if line)
        return sorted(ids)

    def _poll(self, ids: list[str]) -> None:
        asked = self._clock()  # the interval runs from the question, however long it took
        states: dict[str, tuple[str, str]] = {}
        answered = True
        for i in range(0, len(ids), CHUNK):
            self.calls += 1
            try:
                done = self._run(squeue_argv(self._binary, ids[i : i + CHUNK]), self._env)
            except (OSError, subprocess.TimeoutExpired):
                answered = False
                break
            if done.returncode != 0 and not done.stdout.strip():
                if "invalid job id" in done.stderr.lower():
                    continue  # (one id asked, and forgotten): absent, scontrol says the rest
                answered = False
                break
            states.update(parse_squeue(done.stdout))
        self._at = asked
        self._asked = set(ids)
        self._unseen.clear()
        self._answered = answered
        if answered:
            self._states = states


_SHARED: dict[tuple[str, str], SlurmPoller] = {}
_SHARED_LOCK = threading.Lock()


MAGIC = "ckpt-ha-squeue 1"
END = "end\n"


def format_answer(
    at: float, answered: bool, ids: Sequence[str], states: Mapping[str, tuple[str, str]]
) -> str:
    """The shared answer: a header (``MAGIC at answered``), one ``id|state|reason`` line per
    id asked (``id||``: squeue did not list it), and `END` (a file without it is partial)."""
    lines = [f"{MAGIC} {at!r} {int(answered)}\n"]
    lines += [f"{i}|{'|'.join(states.get(i, ABSENT))}\n" for i in ids]
    return "".join(lines) + END


def parse_answer(
    text: str, wanted: set[str]
) -> tuple[float, bool, dict[str, tuple[str, str]]] | None:
    """(at, answered, the states of those of ``wanted`` it covers; `ABSENT`: asked, not
    listed) from `format_answer`'s text; None if it is not whole. A process waiting on a few
    jobs looks for their lines; one waiting on many reads them all."""
    header, _, body = text.partition("\n")
    parts = header.split(" ")
    if not text.endswith("\n" + END) or len(parts) != 4 or " ".join(parts[:2]) != MAGIC:
        return None
    try:
        at, answered = float(parts[2]), parts[3] == "1"
    except ValueError:
        return None
    found: dict[str, tuple[str, str]] = {}
    if len(wanted) > 32:
        for line in body.splitlines():
            got = line.split("|", 2)
            if len(got) == 3 and got[0] in wanted:
                found[got[0]] = (got[1], got[2])
        return at, answered, found
    body = "\n" + body
    for i in wanted:
        start = body.find(f"\n{i}|")
        if start >= 0:
            got = body[start + 1 : body.find("\n", start + 1)].split("|", 2)
            if len(got) == 3:
                found[i] = (got[1], got[2])
    return at, answered, found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_atomic(path: Path, text: str) -> None:
    """``text`` at ``path``, never seen half written (a temporary file renamed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[bool]:
    """The exclusive lock on ``path`` if free (True), else False at once; released on exit
    (or by the kernel when the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def share_dir(env: Mapping[str, str], binary: str) -> Path | None:
    """The host's shared directory for this user and cluster (`DIR_ENV`; None: ``off``)."""
    chosen = env.get(DIR_ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    cluster = hashlib.sha256(f"{binary}\0{env.get('SLURM_CONF', '')}".encode()).hexdigest()[:12]
    base = env.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"ckpt-ha-squeue-{os.getuid()}-{cluster}"


def shared_poller(env: Mapping[str, str], interval_s: float = POLL_S) -> SlurmPoller:
    """The process's poller for the cluster ``env`` names (its ``SLURM_CONF`` and ``squeue``),
    sharing its answers with the host's other processes through `share_dir` (this process
    alone if that directory cannot be made or is not this user's)."""
    binary = shutil.which("squeue", path=env.get("PATH")) or "squeue"
    key = (binary, env.get("SLURM_CONF", ""))
    with _SHARED_LOCK:
        poller = _SHARED.get(key)
        if poller is None:
            share = share_dir(env, binary)
            try:
                poller = SlurmPoller(env=env, interval_s=interval_s, binary=binary, share=share)
                if share is not None and share.stat().st_uid != os.getuid():
                    raise PermissionError(f"{share} is not this user's")
            except OSError:
                poller = SlurmPoller(env=env, interval_s=interval_s, binary=binary)
            _SHARED[key] = poller
        return poller
