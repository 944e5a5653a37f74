"""How an attempt ended, in the terms of ``job.failed`` (pure: no I/O).

* exit 0 → success;
* SIGKILL → ``oom`` when the cgroup's ``oom_kill`` counter grew meanwhile, else ``node_exit``
  (the node, the scheduler or an operator took the process away: the platform's side);
* a signal the runner itself forwarded (SIGTERM/SIGINT to the runner) → ``preempted``;
* any other signal or a non-zero exit → ``error`` (the job's side).

When a scheduler reported the end (``ExitInfo.state``: Slurm's final ``JobState``), its state
decides first (`SCHEDULER_STATES`): ``NODE_FAIL`` / ``BOOT_FAIL`` → ``node_lost``;
``PREEMPTED`` → ``preempted``; ``CANCELLED`` → ``cancelled`` (a user's decision: never
restored); ``OUT_OF_MEMORY`` → ``oom``; ``TIMEOUT`` / ``DEADLINE`` → ``error`` (the job's limit);
``FAILED`` and ``COMPLETED`` fall through to the exit code and signal above (``FAILED`` with
``ExitCode 0:9`` is a SIGKILL from outside: ``node_exit``).

When the command is a torchrun group and a rank failed, the rank's exit code or signal and its
own error line decide instead of torchrun's (torchrun exits 1 with the same banner whatever
happened); ``detail`` names the rank.

The signature (R9: the same failure repeating is a stop condition) is the cause, the exit code
or signal and the last stderr line (a failed rank's own error line) with its numbers blanked,
so "OOM at step 1234" and "OOM at step 1240" count as the same failure.
"""

from __future__ import annotations

import hashlib
import re
import signal as signals
from dataclasses import dataclass

from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.runner.adapter import ExitInfo

_NUMBERS = re.compile(r"\d+")


@dataclass(frozen=True)
class Failure:
    cause: FailureCause
    side: FailureSide
    detail: str
    signature: str
    exit_code: int | None
    """The exit code that decided (a failed torchrun rank's, else the command's)."""
    signal: int | None
    stalled_ranks: tuple[int, ...] = ()
    """Cause ``hang``: the ranks that stopped first."""
    hang_after_s: float | None = None
    """Cause ``hang``: the silence that made it one."""


def signal_name(sig: int) -> str:
    try:
        return signals.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


SCHEDULER_STATES: dict[str, tuple[FailureCause, FailureSide, str]] = {
    "NODE_FAIL": (FailureCause.NODE_LOST, FailureSide.INFRASTRUCTURE,
                  "the scheduler lost the node the attempt ran on"),
    "BOOT_FAIL": (FailureCause.NODE_LOST, FailureSide.INFRASTRUCTURE,
                  "the node allocated to the attempt failed to boot"),
    "PREEMPTED": (FailureCause.PREEMPTED, FailureSide.INFRASTRUCTURE,
                  "preempted by the scheduler for a higher-priority job"),
    "CANCELLED": (FailureCause.CANCELLED, FailureSide.JOB,
                  "cancelled by a user (scancel): not restored"),
    "OUT_OF_MEMORY": (FailureCause.OOM, FailureSide.JOB,
                      "the scheduler's memory limit killed the attempt"),
    "TIMEOUT": (FailureCause.ERROR, FailureSide.JOB, "the job's time limit was reached"),
    "DEADLINE": (FailureCause.ERROR, FailureSide.JOB, "the job's deadline was reached"),
}  # fmt: skip
"""A scheduler's final state that decides the cause by itself (the exit code it shows is not
final then: Slurm fills it in later, if the node ever reports it)."""


def classify(
    info: ExitInfo, *, forwarded: int | None = None, elastic_restarts: int = 0
) -> Failure | None:
    """None for a success; otherwise the failure to report. ``forwarded``: a signal the runner
    passed on to the attempt because it was itself asked to stop. ``elastic_restarts``:
    torchrun's ``--max-restarts``, all used up when it reports a failed rank."""
    if info.succeeded and forwarded is None:
        return None
    rank = info.rank if forwarded is None and info.signal is None else None
    code, sig = (rank.exit_code, rank.signal) if rank else (info.exit_code, info.signal)
    line = rank.message if rank else info.last_error_line
    scheduled = SCHEDULER_STATES.get(info.state or "")
    if forwarded is not None:
        cause, side = FailureCause.PREEMPTED, FailureSide.INFRASTRUCTURE
        detail = f"stopped: the runner got {signal_name(forwarded)} and passed it on"
    elif scheduled is not None:
        cause, side, detail = scheduled
        rank = None
        detail = f"{detail} ({info.reported_by}: {info.state}, reason {info.reason or 'None'})"
    elif sig == signals.SIGKILL and info.oom_killed:
        cause, side = FailureCause.OOM, FailureSide.JOB
        detail = "killed by the kernel's OOM killer (the cgroup's oom_kill counter grew)"
    elif sig == signals.SIGKILL:
        cause, side = FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE
        detail = "killed by SIGKILL (node, scheduler or operator; no OOM kill recorded)"
    elif sig is not None:
        cause, side = FailureCause.ERROR, FailureSide.JOB
        detail = f"killed by {signal_name(sig)}"
    elif code is not None or info.state is None:
        cause, side = FailureCause.ERROR, FailureSide.JOB
        detail = f"exit code {code}"
    else:
        cause, side = FailureCause.UNKNOWN, FailureSide.UNKNOWN
        detail = f"{info.reported_by} could not tell how the attempt ended"
    if info.state is not None and scheduled is None and forwarded is None:
        detail = f"{detail} ({info.reported_by}: {info.state}, reason {info.reason or 'None'})"
    if rank is not None:
        who = f"rank {rank.rank}" if rank.rank is not None else "a rank"
        if info.group_running:
            detail = f"{who} (torchrun): {detail}; seen by the runner, which stops the group"
        else:
            ended = f"torchrun ended the group and exited {info.exit_code}"
            detail = f"{who} (torchrun): {detail}; {ended}"
        if elastic_restarts > 0:
            detail += f" after using its --max-restarts {elastic_restarts}"
    if line:
        detail = f"{detail}; {'the rank' if rank else 'last stderr line'}: {line}"
    return Failure(cause, side, detail, signature(cause, code, sig, line), code, sig)


def signature(cause: FailureCause, exit_code: int | None, sig: int | None, line: str) -> str:
    shape = _NUMBERS.sub("#", line)
    text = f"{cause.value}|{exit_code}|{sig}|{shape}"
    return f"{cause.value}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
