"""The runner without a broker: how an attempt's end becomes ``job.failed`` (cause, side, and a
signature that stays the same when the same failure repeats with other numbers in its message),
the environment an attempt is launched with, and `ckpt-ha run`'s one-line argument errors."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from pydantic import SecretStr

from ckpt_ha import sdk
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.cli.main import main
from ckpt_ha.contracts.checkpoint import FailureSide, RuntimeEnvironment, Topology
from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.contracts.resume import Compatibility, ResumeMode, ResumePlannedV2
from ckpt_ha.runner.adapter import ExitInfo
from ckpt_ha.runner.domain import classify
from ckpt_ha.runner.launch import RunSpec, child_env, runtime_environment


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


def test_the_training_process_gets_its_jobs_key_and_never_the_master_key(tmp_path: Path) -> None:
    from ckpt_ha.contracts import signing
    from ckpt_ha.sdk import protocol

    master = bytes(range(32))
    spec = RunSpec("job-k", "run-k", ("train",), "/data/ckpt", tmp_path)
    bus = BusConfig(url="nats://n:4222", prefix="px", signing_keys=(master,))
    base = {
        "PATH": "/bin",
        "CKPT_HA_SIGNING_KEY": master.hex(),
        "CKPT_HA_SIGNING_KEY_FILE": "/run/secrets/signing.key",
        "CKPT_HA_SIGNING_KEY_PREVIOUS": "00" * 32,
        "CKPT_HA_NATS_PASSWORD_FILE": "/run/secrets/runner.password",
    }
    env = child_env(base, spec, bus, 1, RuntimeEnvironment(), None)
    assert not [k for k in env if k.startswith("CKPT_HA_SIGNING_KEY")]
    assert "CKPT_HA_NATS_PASSWORD_FILE" not in env
    assert env[protocol.JOB_KEY] == signing.job_key(master, "job-k").hex()
    ctx = sdk.context(env)
    assert ctx is not None
    assert ctx.bus is not None
    assert ctx.bus.job_key == signing.job_key(master, "job-k")


def test_the_attempts_environment_carries_the_protocol_and_drops_a_stale_plan(
    tmp_path: Path,
) -> None:
    from ckpt_ha.sdk import protocol

    spec = RunSpec("job-e", "run-e", ("train",), "/data/ckpt", tmp_path, code_version="c1")
    bus = BusConfig(url="nats://n:4222", user="runner", password=SecretStr("pw"), prefix="px")
    environment = RuntimeEnvironment(python_version="3.11.7")
    base = {"PATH": "/bin", protocol.RESUME_PLAN: "{stale}", protocol.PLAN_ID: "old"}
    first = child_env(base, spec, bus, 1, environment, None)
    assert first["PATH"] == "/bin"
    assert protocol.RESUME_PLAN not in first
    assert protocol.PLAN_ID not in first
    ctx = sdk.context(first)
    assert ctx is not None
    assert (ctx.job_id, ctx.run_id, ctx.attempt, ctx.storage_root) == (
        "job-e",
        "run-e",
        1,
        "/data/ckpt",
    )
    assert ctx.bus == sdk.BusEndpoint(
        "nats://n:4222", prefix="px", user="runner", password=SecretStr("pw")
    )
    assert (ctx.environment, ctx.topology, ctx.code_version) == (
        environment,
        Topology(world_size=1),
        "c1",
    )
    assert ctx.progress_file == str(tmp_path / "progress")

    plan = ResumePlannedV2(
        job_id="job-e",
        plan_id="p-1",
        failed_run_id="run-e",
        attempt=2,
        checkpoint_id="job-e-0123456789abcdef",
        checkpoint_uri="file:///data/ckpt/job-e/step-00000040",
        step=40,
        mode=ResumeMode.EXACT,
        compatibility=Compatibility.IDENTICAL,
    )
    second = child_env(base, spec, bus, 2, environment, plan)
    assert (second[protocol.PLAN_ID], second[protocol.RESTORE_STEP]) == ("p-1", "40")
    assert second[protocol.RESTORE_URI] == plan.checkpoint_uri
    resumed = sdk.context(second)
    assert resumed is not None
    assert resumed.plan == plan
    assert resumed.attempt == 2


def test_the_runtime_environment_names_this_python_and_numpy() -> None:
    import platform

    import numpy as np

    env = runtime_environment("registry/train:1")
    assert env.python_version == platform.python_version()
    assert env.libraries["numpy"] == np.__version__
    assert env.image == "registry/train:1"
    assert env.framework in ("torch", "numpy")
    assert env.framework_version == env.libraries[env.framework]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["run", "--job", "j"], 2, "no training command"),
        (["run", "--job", "j", "--", "no-such-binary-xyz"], 2, "cannot start 'no-such-binary-xyz'"),
        (["run", "--job", "j", "--plan-timeout", "-1", "--", "true"], 2, "must be > 0"),
        (["run", "--job", "j", "--policy", "/nonexistent.json", "--", "true"], 2, "--policy"),
        (["run", "--job", "j", "--scheduler", "pbs", "--", "true"], 2, "invalid choice"),
        (["run", "--job", "j", "--partition", "low", "--", "true"], 2, "need --scheduler slurm"),
        (["run", "--job", "j", "--sbatch-arg=--mem=1G", "--", "true"], 2, "need --scheduler"),
        (
            ["run", "--job", "j", "--policy", "p.json", "--tier", "t", "--", "true"],
            2,
            "not allowed",
        ),
        (["run", "--job", "j", "--resume", "--", "true"], 2, "--resume takes over a run"),
        (["run", "--job", "j", "--heartbeat-s", "-1", "--", "true"], 2, "must be >= 0"),
        (
            ["run", "--job", "j", "--scheduler", "slurm", "--sbatch-arg=--requeue", "--", "true"],
            2,
            "would override --requeue",
        ),
        (
            ["run", "--job", "j", "--heartbeat-s", "5", "--deadline-s", "5", "--", "true"],
            2,
            "--deadline-s must be longer than --heartbeat-s",
        ),
        (
            ["run", "--job", "j", "--heartbeat-s", "0", "--deadline-s", "5", "--", "true"],
            2,
            "--deadline-s must be longer than --heartbeat-s",
        ),
    ],
)
def test_run_argument_errors_are_one_line(
    argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_bad_policy_file_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"max_restarts": -1}))
    assert main(["run", "--job", "j", "--policy", str(policy), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "max_restarts" in err
    assert err.count("\n") == 1


def test_resume_without_a_recorded_attempt_says_so_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_HA_HOME", str(tmp_path))
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")  # never reached
    argv = ["run", "--job", "j", "--run-id", "r1", "--resume", "--", "true"]
    assert main(argv) == 4  # refused: nothing to take over
    err = capsys.readouterr().err
    assert "no attempt.json: this run never started here" in err
    assert err.count("\n") == 1
    folder = tmp_path / "runs" / "j" / "r1"
    folder.mkdir(parents=True)
    (folder / "attempt.json").write_text(json.dumps({"attempt": 2, "run_id": "other"}))
    assert main(argv) == 4
    assert "names no attempt of run r1" in capsys.readouterr().err


def test_the_heartbeat_settings_are_the_fallback_of_the_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_HA_HEARTBEAT_S", "0")
    assert main(["run", "--job", "j", "--deadline-s", "5", "--", "true"]) == 2
    assert "--deadline-s must be longer than --heartbeat-s" in capsys.readouterr().err
    monkeypatch.setenv("CKPT_HA_HEARTBEAT_S", "10")
    monkeypatch.setenv("CKPT_HA_DEADLINE_S", "10")
    assert main(["run", "--job", "j", "--", "true"]) == 2
    assert "--deadline-s must be longer than --heartbeat-s" in capsys.readouterr().err
