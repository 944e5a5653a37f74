"""How an attempt's end becomes ``job.failed``: cause, side and a signature that stays the same
when the same failure repeats with different numbers in its message."""

from __future__ import annotations

import signal

from contracts.checkpoint import FailureSide
from contracts.job import FailureCause
from services.runner.adapter import ExitInfo
from services.runner.domain import classify


def test_exit_zero_is_a_success() -> None:
    assert classify(ExitInfo(0)) is None


def test_a_non_zero_exit_is_the_jobs_error_with_its_last_line() -> None:
    failure = classify(ExitInfo(1, last_error_line="ValueError: bad batch 17"))
    assert failure is not None
    assert (failure.cause, failure.side) == (FailureCause.ERROR, FailureSide.JOB)
    assert "exit code 1" in failure.detail
    assert "ValueError: bad batch 17" in failure.detail


def test_sigkill_is_a_node_exit_unless_the_oom_killer_did_it() -> None:
    node = classify(ExitInfo(None, signal.SIGKILL))
    oom = classify(ExitInfo(None, signal.SIGKILL, oom_killed=True))
    assert node is not None
    assert oom is not None
    assert (node.cause, node.side) == (FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE)
    assert (oom.cause, oom.side) == (FailureCause.OOM, FailureSide.JOB)
    assert node.signature != oom.signature


def test_other_signals_are_errors_and_a_forwarded_stop_is_a_preemption() -> None:
    segv = classify(ExitInfo(None, signal.SIGSEGV))
    assert segv is not None
    assert segv.cause is FailureCause.ERROR
    assert "SIGSEGV" in segv.detail
    stopped = classify(ExitInfo(None, signal.SIGTERM), forwarded=signal.SIGTERM)
    assert stopped is not None
    assert stopped.cause is FailureCause.PREEMPTED
    # Even a command that exits 0 on SIGTERM did not finish the run.
    assert classify(ExitInfo(0), forwarded=signal.SIGINT) is not None


def test_the_signature_ignores_numbers_but_not_the_failure() -> None:
    def sig(code: int, line: str) -> str:
        failure = classify(ExitInfo(code, last_error_line=line))
        assert failure is not None
        return failure.signature

    same = sig(1, "CUDA OOM at step 1200 (tried 4096 MiB)")
    assert same == sig(1, "CUDA OOM at step 1260 (tried 2048 MiB)")
    assert same.startswith("error:")
    assert same != sig(2, "CUDA OOM at step 1200 (tried 4096 MiB)")
    assert same != sig(1, "NaN loss at step 1200")
