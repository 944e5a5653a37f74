"""How an attempt ended, in the terms of ``job.failed`` (pure: no I/O).

* exit 0 → success;
* SIGKILL → ``oom`` when the cgroup's ``oom_kill`` counter grew meanwhile, else ``node_exit``
  (the node, the scheduler or an operator took the process away: the platform's side);
* a signal the runner itself forwarded (SIGTERM/SIGINT to the runner) → ``preempted``;
* any other signal or a non-zero exit → ``error`` (the job's side).

The signature (R9: the same failure repeating is a stop condition) is the cause, the exit code
or signal and the last stderr line with its numbers blanked, so "OOM at step 1234" and "OOM at
step 1240" count as the same failure.
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


def signal_name(sig: int) -> str:
    try:
        return signals.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def classify(info: ExitInfo, *, forwarded: int | None = None) -> Failure | None:
    """None for a success; otherwise the failure to report. ``forwarded``: a signal the runner
    passed on to the attempt because it was itself asked to stop."""
    if info.succeeded and forwarded is None:
        return None
    line = info.last_error_line
    if forwarded is not None:
        cause, side = FailureCause.PREEMPTED, FailureSide.INFRASTRUCTURE
        detail = f"stopped: the runner got {signal_name(forwarded)} and passed it on"
    elif info.signal == signals.SIGKILL and info.oom_killed:
        cause, side = FailureCause.OOM, FailureSide.JOB
        detail = "killed by the kernel's OOM killer (the cgroup's oom_kill counter grew)"
    elif info.signal == signals.SIGKILL:
        cause, side = FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE
        detail = "killed by SIGKILL (node, scheduler or operator; no OOM kill recorded)"
    elif info.signal is not None:
        cause, side = FailureCause.ERROR, FailureSide.JOB
        detail = f"killed by {signal_name(info.signal)}"
    else:
        cause, side = FailureCause.ERROR, FailureSide.JOB
        detail = f"exit code {info.exit_code}"
    if line:
        detail = f"{detail}; last stderr line: {line}"
    return Failure(cause, side, detail, signature(cause, info))


def signature(cause: FailureCause, info: ExitInfo) -> str:
    shape = _NUMBERS.sub("#", info.last_error_line)
    text = f"{cause.value}|{info.exit_code}|{info.signal}|{shape}"
    return f"{cause.value}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
