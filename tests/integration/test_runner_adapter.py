"""The embedded adapter with real child processes: exit 0, exit 1, SIGKILL, an OOM kill, and a
real two-rank torchrun group in which one rank is SIGKILLed or raises."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.runner.adapter import (
    ExitInfo,
    LocalProcess,
    memory_events,
    oom_kills,
    process_tree,
)
from ckpt_ha.runner.domain import classify
from ckpt_ha.runner.rankwatch import RankDeath, RankWatch
from ckpt_ha.runner.torchrun import ERROR_FILE_ENV
from tests.support.torch_tools import require_torch

pytestmark = pytest.mark.integration

RANK_FAULT = Path(__file__).resolve().parents[1] / "support" / "torchrun_rank_fault.py"


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_exit_zero_and_its_environment() -> None:
    out = io.BytesIO()
    adapter = LocalProcess(stderr=out)
    handle = adapter.start(
        py("import os, sys; sys.stderr.write(os.environ['CKPT_HA_JOB'] + '\\n')"),
        {**os.environ, "CKPT_HA_JOB": "job-env"},
    )
    assert handle.isdigit()
    info = adapter.wait()
    assert (info.exit_code, info.signal, info.succeeded) == (0, None, True)
    assert classify(info) is None
    assert out.getvalue() == b"job-env\n"  # stderr copied through


def test_exit_one_keeps_the_last_stderr_line() -> None:
    out = io.BytesIO()
    adapter = LocalProcess(stderr=out)
    adapter.start(py("import sys; print('first', file=sys.stderr); sys.exit('boom at step 3')"), {})
    info = adapter.wait()
    assert (info.exit_code, info.signal) == (1, None)
    assert info.last_error_line == "boom at step 3"
    failure = classify(info)
    assert failure is not None
    assert failure.cause is FailureCause.ERROR


def test_sigkill_is_reported_as_a_node_exit() -> None:
    adapter = LocalProcess(stderr=io.BytesIO())
    handle = adapter.start(py("import time; print('up', flush=True); time.sleep(60)"), {})
    time.sleep(0.3)
    os.kill(int(handle), signal.SIGKILL)
    info = adapter.wait()
    assert (info.exit_code, info.signal, info.oom_killed) == (None, signal.SIGKILL, False)
    failure = classify(info)
    assert failure is not None
    assert failure.cause is FailureCause.NODE_EXIT


def test_an_oom_kill_counted_by_the_cgroup_is_reported_as_oom(tmp_path: Path) -> None:
    """The kernel counts OOM kills in memory.events; a file in the same format stands in for
    the cgroup here (the test cannot make the real kernel OOM-kill safely)."""
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    adapter = LocalProcess(memory_events_file=events, stderr=io.BytesIO())
    handle = adapter.start(py("import time; time.sleep(60)"), {})
    events.write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n")
    os.kill(int(handle), signal.SIGKILL)
    info = adapter.wait()
    assert info.oom_killed
    failure = classify(info)
    assert failure is not None
    assert failure.cause is FailureCause.OOM


def test_kill_forwards_a_signal_and_is_a_no_op_afterwards() -> None:
    adapter = LocalProcess(stderr=io.BytesIO())
    adapter.start(py("import time; time.sleep(60)"), {})
    time.sleep(0.2)
    adapter.kill(signal.SIGTERM)
    info = adapter.wait()
    assert info.signal == signal.SIGTERM
    adapter.kill(signal.SIGTERM)  # nothing runs any more: no error


def test_this_machines_cgroup_counter_is_readable_when_there_is_one() -> None:
    path = memory_events()
    if path is not None:
        assert isinstance(oom_kills(path), int)
    assert oom_kills(None) is None


def torchrun(mode: str, error_file: Path) -> ExitInfo:
    """``torchrun --nproc_per_node 2`` (gloo) in which rank 1 fails as ``mode`` says."""
    require_torch()
    adapter = LocalProcess(stderr=io.BytesIO())
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--nnodes", "1", str(RANK_FAULT), mode]
    adapter.start(command, {**os.environ, ERROR_FILE_ENV: str(error_file)})
    return adapter.wait()


def test_a_sigkilled_torchrun_rank_is_reported_as_that_ranks_node_exit(tmp_path: Path) -> None:
    killed = torchrun("kill", tmp_path / "kill.json")
    assert (killed.exit_code, killed.signal) == (1, None)  # torchrun's own ending
    assert not (tmp_path / "kill.json").exists()  # a killed rank leaves no error file
    assert killed.rank is not None
    assert (killed.rank.rank, killed.rank.signal) == (1, signal.SIGKILL)
    failure = classify(killed)
    assert failure is not None
    assert (failure.cause, failure.side) == (FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE)
    assert failure.detail.startswith("rank 1 (torchrun): killed by SIGKILL")

    raised = torchrun("record", tmp_path / "record.json")
    assert (tmp_path / "record.json").exists()
    error = classify(raised)
    assert error is not None
    assert (error.cause, error.side, error.exit_code) == (FailureCause.ERROR, FailureSide.JOB, 1)
    assert "rank 1 (torchrun)" in error.detail
    assert error.detail.endswith("ValueError: loss is nan at step 18")
    assert error.signature != failure.signature


SPAWNER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
kids = [subprocess.Popen([sys.executable, "-c", child], start_new_session=True) for _ in range(2)]
open(sys.argv[1], "w").write(" ".join(str(k.pid) for k in kids))
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"  # a zombie is gone, not yet reaped


def test_stop_ends_every_process_of_a_hung_attempt_even_ranks_in_their_own_sessions(
    tmp_path: Path,
) -> None:
    """Issue 28: torchrun starts each rank in a session of its own, so signalling the command's
    process group misses them; a hung attempt's ranks ignore SIGTERM. `stop` ends them all."""
    pids_file = tmp_path / "pids"
    adapter = LocalProcess(stderr=io.BytesIO())
    adapter.start([sys.executable, "-c", SPAWNER, str(pids_file)], {**os.environ})
    deadline = time.monotonic() + 30
    while not (pids_file.exists() and pids_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    kids = [int(p) for p in pids_file.read_text().split()]
    assert len(kids) == 2
    assert all(os.getpgid(k) == k for k in kids)  # their own sessions, like torchrun's ranks
    started = time.monotonic()
    adapter.stop(grace_s=1.0)
    info = adapter.wait()
    assert info.signal == signal.SIGKILL  # it ignored SIGTERM: killed after the grace
    deadline = time.monotonic() + 10
    while not all(_gone(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(k) for k in kids), kids
    assert time.monotonic() - started < 10


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_the_first_child_killed_is_seen_with_its_rank_before_it_is_reaped() -> None:
    """The rank watch on real children of this process (as torchrun holds its ranks): a death
    by a signal is read from /proc while the zombie waits to be reaped."""
    ranks = [subprocess.Popen(SLEEPER, env={**os.environ, "RANK": str(r)}) for r in range(2)]
    try:
        watch = RankWatch(os.getpid())
        assert watch.poll() is None  # both alive
        assert {watch.ranks[p.pid] for p in ranks} == {0, 1}
        os.kill(ranks[1].pid, signal.SIGKILL)
        death = None
        while death is None:  # the zombie stays until wait(): no race here
            death = watch.poll()
        assert death == RankDeath(ranks[1].pid, 1, signal.SIGKILL)
        ranks[1].wait()
        assert watch.poll() is None  # reaped: gone from the children, never reported again
        ranks[0].terminate()
        ranks[0].wait()
        death = watch.poll()
        assert death is None  # reaped already by wait()
    finally:
        for p in ranks:
            p.kill()
            p.wait()


def test_a_child_that_exits_with_a_code_is_left_to_torchruns_report() -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"],
                             env={**os.environ, "RANK": "1"})  # fmt: skip
    watch = RankWatch(os.getpid())
    try:
        while True:
            stat = open(f"/proc/{child.pid}/stat").read()  # noqa: SIM115
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                break
        assert watch.poll() is None
    finally:
        assert child.wait() == 3


def test_the_runners_rank_watch_reports_a_sigkilled_rank_before_torchrun_ends_the_group(
    tmp_path: Path,
) -> None:
    """Issue 28: with ``watch_ranks`` (`ckpt-ha run`) the first rank's death is seen while
    torchrun still runs (its monitor interval is made long here so the dead rank stays a zombie
    long enough on any machine), with the same cause; `stop` then ends the rest."""
    require_torch()
    adapter = LocalProcess(stderr=io.BytesIO(), watch_ranks=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--nnodes", "1", "--monitor-interval", "30", str(RANK_FAULT), "kill"]
    adapter.start(command, {**os.environ, ERROR_FILE_ENV: str(tmp_path / "kill.json")})
    seen = adapter.wait()
    assert seen.group_running
    assert (seen.exit_code, seen.signal) == (None, None)  # torchrun has not ended
    assert seen.rank is not None
    assert (seen.rank.rank, seen.rank.signal) == (1, signal.SIGKILL)
    failure = classify(seen)
    assert failure is not None
    assert (failure.cause, failure.side) == (FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE)
    assert failure.detail.startswith("rank 1 (torchrun): killed by SIGKILL")
    assert "seen by the runner" in failure.detail
    assert adapter.pid is not None
    tree = process_tree(adapter.pid)
    assert len(tree) >= 2  # torchrun and rank 0 at least
    adapter.stop(grace_s=5.0)
    ended = adapter.wait()  # the second wait: the attempt's real end
    assert not ended.group_running
    assert not ended.succeeded
    assert all(_gone(pid) for pid, _ in tree)
