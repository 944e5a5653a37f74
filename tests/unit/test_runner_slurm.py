"""The Slurm adapter without a cluster: how a final ``scontrol show job`` record becomes
``job.failed`` (the table of docs/SCHEDULERS.md), and what ``sbatch`` is asked to do. The same
endings against a real Slurm: ``tests/integration/test_slurm_restore.py``."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from ckpt_ha.cli.main import main
from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.core.scontrol import parse_exit_code, parse_record
from ckpt_ha.runner.adapter import ExitInfo
from ckpt_ha.runner.domain import classify
from ckpt_ha.runner.slurm import SlurmBatch
from ckpt_ha.sdk import protocol


def ended(state: str, exit_code: str, reason: str = "None") -> ExitInfo:
    code, sig = parse_exit_code(exit_code)
    return ExitInfo(code, sig, last_error_line="step 7", state=state, reason=reason,
                    reported_by="slurm")  # fmt: skip


@pytest.mark.parametrize(
    ("state", "exit_code", "reason", "cause", "side"),
    [
        ("NODE_FAIL", "0:0", "NodeDown", FailureCause.NODE_LOST, FailureSide.INFRASTRUCTURE),
        ("NODE_FAIL", "143:0", "NodeDown", FailureCause.NODE_LOST, FailureSide.INFRASTRUCTURE),
        ("PREEMPTED", "143:0", "None", FailureCause.PREEMPTED, FailureSide.INFRASTRUCTURE),
        ("CANCELLED", "143:0", "None", FailureCause.CANCELLED, FailureSide.JOB),
        ("CANCELLED", "0:0", "None", FailureCause.CANCELLED, FailureSide.JOB),  # while pending
        ("FAILED", "0:9", "JobLaunchFailure", FailureCause.NODE_EXIT, FailureSide.INFRASTRUCTURE),
        ("FAILED", "3:0", "NonZeroExitCode", FailureCause.ERROR, FailureSide.JOB),
        ("FAILED", "0:11", "NonZeroExitCode", FailureCause.ERROR, FailureSide.JOB),
        ("OUT_OF_MEMORY", "0:125", "OutOfMemory", FailureCause.OOM, FailureSide.JOB),
        ("TIMEOUT", "0:15", "TimeLimit", FailureCause.ERROR, FailureSide.JOB),
        ("UNKNOWN", "", "gone", FailureCause.UNKNOWN, FailureSide.UNKNOWN),
    ],
)
def test_a_final_state_is_classified(
    state: str, exit_code: str, reason: str, cause: FailureCause, side: FailureSide
) -> None:
    failure = classify(ended(state, exit_code, reason))
    assert failure is not None
    assert (failure.cause, failure.side) == (cause, side)
    assert f"slurm: {state}" in failure.detail
    assert failure.signature.startswith(f"{cause.value}:")


def test_completed_with_exit_0_is_a_success_and_a_stopped_runner_a_preemption() -> None:
    assert classify(ended("COMPLETED", "0:0")) is None
    stopped = classify(ended("CANCELLED", "0:15"), forwarded=signal.SIGTERM)
    assert stopped is not None
    assert stopped.cause is FailureCause.PREEMPTED  # the runner cancelled it, not a user


def test_exit_codes_read_as_exit_or_signal() -> None:
    assert parse_exit_code("0:9") == (None, 9)
    assert parse_exit_code("3:0") == (3, None)
    assert parse_exit_code("0:0") == (0, None)
    assert parse_exit_code("") == (None, None)
    record = parse_record("JobId=7 JobName=x y JobState=NODE_FAIL Reason=NodeDown ExitCode=0:0")
    fields = (record["JobName"], record["JobState"], record["ExitCode"])
    assert fields == ("x y", "NODE_FAIL", "0:0")


def test_sbatch_never_requeues_exports_the_attempt_and_lets_the_user_add_options(
    tmp_path: Path,
) -> None:
    adapter = SlurmBatch(partition="high", sbatch_args=["--mem=1G"], output_dir=tmp_path)
    env = {protocol.JOB: "j1", protocol.ATTEMPT: "2"}
    argv = adapter.sbatch_argv(["python", "-m", "train", "--lr", "0.1 0.2"], env)
    assert argv[0] == "sbatch"
    assert {"--parsable", "--no-requeue", "--export=ALL", "--job-name=ckpt-ha:j1:2",
            "--partition=high", f"--output={tmp_path / 'slurm-%j.out'}"} <= set(argv)  # fmt: skip
    assert argv[-3:] == ["--mem=1G", "--wrap", "python -m train --lr '0.1 0.2'"]


def test_without_slurms_commands_the_slurm_scheduler_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, scontrol nor scancel here
    assert main(["run", "--job", "j", "--scheduler", "slurm", "--", sys.executable]) == 2
    err = capsys.readouterr().err
    assert err == "ckpt-ha: --scheduler slurm: sbatch, scontrol, scancel not found on PATH\n"
