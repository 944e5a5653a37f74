"""The Slurm scheduler adapter: each attempt of `ckpt-ha run` is one Slurm batch job.

``start`` submits the command with ``sbatch --parsable --no-requeue --export=ALL --wrap`` from
a process whose environment is exactly the attempt's (the protocol variables of
`ckpt_ha.runner.launch.child_env`, a resumed attempt's plan and restore target included), so
the batch job gets them; ``wait`` watches the job through the process's shared poller
(`ckpt_ha.runner.slurm_poll`: one ``squeue`` per interval for every job the host's processes
wait on, not one ``scontrol`` per job) until it ends, reads its final ``scontrol show job -o``
record once and returns it in an `ExitInfo` (``state``, ``reason``, the exit code or signal) that
`ckpt_ha.runner.domain.classify` turns into ``job.failed``'s cause, ``reported_by="slurm"``;
``kill`` cancels the job (the runner itself was asked to stop). The job's output file (by
default in the run's state folder) is copied to the runner's stdout as it grows, and its last
line is the failure signature's.

``--no-requeue``: Slurm must not restart the job by itself, or it would rerun the attempt
without the restore target and without a ``job.failed``: the restore-coordinator decides, and
the runner submits the next attempt with the plan (docs/SCHEDULERS.md has the table of states).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import signal as signals
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ckpt_ha.core.scontrol import FINAL_STATES, parse_exit_code, parse_record
from ckpt_ha.runner.adapter import LAST_LINE_CHARS, STDERR_TAIL_LINES, ExitInfo
from ckpt_ha.runner.slurm_poll import ABSENT, POLL_S, Run, SlurmPoller, run_command, shared_poller
from ckpt_ha.sdk import protocol

log = logging.getLogger("ckpt_ha.runner")
REPORTER = "slurm"
FORGOTTEN = "UNKNOWN"
"""The state reported when the controller no longer knows the job (its record expired)."""


class SlurmUnavailable(OSError):
    """A Slurm client command is missing or refused the submission (one line for the user)."""


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/local/bin")
    if found is None:
        raise SlurmUnavailable(f"{name} not found on PATH (install Slurm's client commands)")
    return found


ADAPTER_OWNS: dict[str, str] = {
    "requeue": "the adapter submits --no-requeue: the restore-coordinator decides a rerun",
    "export": "the attempt's protocol variables reach the job through --export=ALL",
    "export-file": "the attempt's protocol variables reach the job through --export=ALL",
    "wrap": "the adapter wraps the training command itself",
    "job-name": "the adapter names the job ckpt-ha:JOB:ATTEMPT",
    "output": "the adapter reads the job's output file (its last line is the failure's)",
    "error": "the adapter reads stderr in the job's output file (the failure's last line)",
    "partition": "use --partition",
    "array": "one attempt is one batch job",
    "wait": "the adapter polls the job's state itself",
    "parsable": "the adapter reads the job id from --parsable",
    "test-only": "an attempt must be submitted",
    "hold": "an attempt must start without a manual release",
}
"""The sbatch options the adapter relies on (long names), and why a user's ``--sbatch-arg``
may not set them: later options win in sbatch, so one would silently override ours."""
_SHORT = {"J": "job-name", "o": "output", "e": "error", "p": "partition", "a": "array",
          "W": "wait", "H": "hold"}  # fmt: skip


class AdapterInvariant(ValueError):
    """A ``--sbatch-arg`` that would override an option the adapter relies on."""

    def __init__(self, arg: str, option: str) -> None:
        self.arg = arg
        self.option = option
        super().__init__(
            f"--sbatch-arg={arg} would override --{option}, which the Slurm adapter sets: "
            f"{ADAPTER_OWNS[option]}"
        )


def check_sbatch_args(args: Sequence[str]) -> None:
    """Raise `AdapterInvariant` for the first argument that names an option of `ADAPTER_OWNS`
    (``--no-requeue``, which says what the adapter does, is fine). sbatch takes an unambiguous
    prefix of a long option, so ``--requ`` counts as ``--requeue``."""
    for arg in args:
        token = arg.strip()
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            if name == "no-requeue" or not name:
                continue
            hit = [o for o in ADAPTER_OWNS if o == name or (len(name) >= 2 and o.startswith(name))]
            if hit:
                raise AdapterInvariant(arg, name if name in ADAPTER_OWNS else hit[0])
        elif token.startswith("-") and len(token) >= 2 and token[1] in _SHORT:
            raise AdapterInvariant(arg, _SHORT[token[1]])


class SlurmBatch:
    """Submit each attempt as a batch job and wait for its final state (one at a time)."""

    def __init__(
        self,
        *,
        partition: str | None = None,
        sbatch_args: Sequence[str] = (),
        output_dir: Path | None = None,
        out: IO[bytes] | None = None,
        poll_s: float = POLL_S,
        run: Run = run_command,
        poller: SlurmPoller | None = None,
    ) -> None:
        """``run``: how Slurm's commands are run; ``poller``: whose ``squeue`` tells the job's
        state (None: the process's poller for the cluster, `shared_poller`)."""
        check_sbatch_args(sbatch_args)
        self.partition = partition
        self.sbatch_args = tuple(sbatch_args)
        self.output_dir = output_dir
        self._out = out if out is not None else sys.stdout.buffer
        self.poll_s = poll_s
        self._run = run
        self._poller = poller
        self._env: dict[str, str] = {}
        self.job_id: str | None = None
        self._output: Path | None = None
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()

    def sbatch_argv(self, command: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """The submission: ours first, the user's ``--sbatch-arg``s after (none of them sets an
        option of ours: `check_sbatch_args`)."""
        name = f"ckpt-ha:{env.get(protocol.JOB, 'job')}:{env.get(protocol.ATTEMPT, '?')}"
        argv = ["sbatch", "--parsable", "--no-requeue", "--export=ALL",
                f"--job-name={name}"]  # fmt: skip
        if self.output_dir is not None:
            argv.append(f"--output={self.output_dir / 'slurm-%j.out'}")
        if self.partition:
            argv.append(f"--partition={self.partition}")
        return [*argv, *self.sbatch_args, "--wrap", shlex.join(command)]

    def start(self, command: Sequence[str], env: Mapping[str, str]) -> str:
        self._env = dict(env)
        self._tail.clear()
        self._offset, self._partial = 0, b""
        argv = self.sbatch_argv(command, env)
        done = self._run([_binary(argv[0]), *argv[1:]], self._env)
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()
            raise SlurmUnavailable(f"sbatch exited {done.returncode}: {why[-1] if why else ''}")
        self.job_id = done.stdout.strip().split(";")[0]
        self._output = (
            self.output_dir / f"slurm-{self.job_id}.out" if self.output_dir is not None else None
        )
        return f"slurm job {self.job_id}"

    def record(self) -> dict[str, str] | None:
        """The job's ``scontrol show job -o`` record; {} when the controller forgot the job;
        None when it could not be asked (try again)."""
        if self.job_id is None:
            raise RuntimeError("record() before start()")
        try:
            done = self._run([_binary("scontrol"), "show", "job", "-o", self.job_id], self._env)
        except subprocess.TimeoutExpired:
            return None
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                return {}
            log.warning("scontrol show job %s: %s", self.job_id, done.stderr.strip())
            return None
        return parse_record(done.stdout.strip())

    def wait(self) -> ExitInfo:
        """Until the job ends: its state from the shared poller's ``squeue``; once that says
        it ended (or lists it no longer), its final record from ``scontrol``, once."""
        if self.job_id is None:
            raise RuntimeError("wait() before start()")
        poller = self._poller if self._poller is not None else shared_poller(self._env)
        poller.watch(self.job_id)
        try:
            while True:
                seen = poller.state(self.job_id)
                self._copy_output()
                if seen is not None and (seen == ABSENT or seen[0] in FINAL_STATES):
                    ended = self._final()
                    if ended is not None:
                        return ended
                time.sleep(self.poll_s)
        finally:
            poller.forget(self.job_id)

    def _final(self) -> ExitInfo | None:
        """The job's end from its ``scontrol`` record (None: not final there yet, or the
        controller could not be asked: keep watching)."""
        record = self.record()
        if record == {}:
            return self._ended(FORGOTTEN, "the controller no longer knows the job", "")
        if record is None or record.get("JobState") not in FINAL_STATES:
            return None
        time.sleep(self.poll_s)  # the output's last lines land as the job ends
        self._copy_output(final=True)
        return self._ended(record["JobState"], record.get("Reason", ""), record.get("ExitCode", ""))

    def _ended(self, state: str, reason: str, exit_code: str) -> ExitInfo:
        code, sig = parse_exit_code(exit_code)
        last = self._tail[-1] if self._tail else ""
        return ExitInfo(code, sig, last_error_line=last, state=state, reason=reason,
                        reported_by=REPORTER)  # fmt: skip

    def _copy_output(self, *, final: bool = False) -> None:
        """Copy what the job wrote since the last look to our stdout; keep its last lines."""
        if self._output is None:
            return
        with self._lock:
            try:
                with self._output.open("rb") as stream:
                    stream.seek(self._offset)
                    data = stream.read()
            except OSError:
                return
            self._offset += len(data)
            if data:
                with contextlib.suppress(OSError, ValueError):
                    self._out.write(data)
                    self._out.flush()
            lines = (self._partial + data).split(b"\n")
            self._partial = b"" if final else lines.pop()
            for raw in lines:
                text = raw.decode(errors="replace").strip()
                if text:
                    self._tail.append(text[-LAST_LINE_CHARS:])

    def stop(self, grace_s: float) -> None:
        """A hung attempt: ``scancel`` it (Slurm ends every step and task of the job, SIGKILL
        after its ``KillWait``); `wait` returns once Slurm says it ended."""
        self.kill()

    def kill(self, sig: int = signals.SIGTERM) -> None:
        """The runner was asked to stop: cancel the job (Slurm sends SIGTERM, then SIGKILL
        ``KillWait`` later). ``sig`` is not forwarded as such: ``scancel --signal`` only
        signals, and a job that ignores it would run on without its runner."""
        if self.job_id is None:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._run([_binary("scancel"), self.job_id], self._env)
