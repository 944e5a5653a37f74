"""One ``squeue`` per interval for every Slurm job a process waits on (issue 33).

Each `ckpt_ha.runner.slurm.SlurmBatch` used to ask ``scontrol show job`` about its own job every
0.5 s: at 10,000 jobs, 20,000 calls a second to slurmctld. Now the adapters of one process and
cluster share a `SlurmPoller` (`shared_poller`): it learns the state of every job they watch
from one ``squeue --jobs=<ids>`` per interval (ids in chunks of `CHUNK`, so that the argument
stays within the kernel's limit), asked by whichever waiter finds the last answer older than
the interval; the others read that answer. Only a job that squeue says ended (or no longer
lists) is asked about once more on its own, with ``scontrol show job``, for its exit code and
reason, as before.

The commands go through a `Run` (`run_command` by default; a fake in the unit tests).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

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
    ) -> None:
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
        self.calls = 0
        """``squeue`` calls made so far (what slurmctld was asked)."""

    def watch(self, job_id: str) -> None:
        with self._lock:
            self._watched.add(job_id)
            self._unseen.add(job_id)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._watched.discard(job_id)
            self._unseen.discard(job_id)
            self._states.pop(job_id, None)

    def state(self, job_id: str) -> tuple[str, str] | None:
        """The watched job's (state, reason) as of the latest ``squeue``, asked first when
        that is older than the interval or did not cover this job yet. `ABSENT`: squeue did
        not list it. None: squeue could not be asked (try again)."""
        with self._lock:
            if job_id in self._unseen or self._clock() - self._at >= self.interval_s:
                self._poll()
            if not self._answered:
                return None
            return self._states.get(job_id, ABSENT)

    def _poll(self) -> None:
        asked = self._clock()  # the interval runs from the question, however long it took
        ids = sorted(self._watched)
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
        self._unseen.clear()
        self._answered = answered
        if answered:
            self._states = states


_SHARED: dict[tuple[str, str], SlurmPoller] = {}
_SHARED_LOCK = threading.Lock()


def shared_poller(env: Mapping[str, str], interval_s: float = POLL_S) -> SlurmPoller:
    """The process's poller for the cluster ``env`` names (its ``SLURM_CONF`` and ``squeue``)."""
    binary = shutil.which("squeue", path=env.get("PATH")) or "squeue"
    key = (binary, env.get("SLURM_CONF", ""))
    with _SHARED_LOCK:
        poller = _SHARED.get(key)
        if poller is None:
            poller = _SHARED[key] = SlurmPoller(env=env, interval_s=interval_s, binary=binary)
        return poller
