"""docs/RUNBOOK.md is runnable: every `sh` block marked `<!-- test: … -->` runs literally, in
document order, through bash against a running embedded stack with real checkpoints.

The stack is started with `ckpt-ha up`; the job is the numpy example under `ckpt-ha run`, frozen
(SIGSTOP) once it has registered three valid checkpoints, so the runbook meets a live job whose
attempt it can end to restore it. The placeholders are bound to real values: JOB, RUN, PROJECT,
NEW_PROJECT, CKPT (the newest valid checkpoint), ROLLBACK (the one before), CKPT_DIR (its
folder), JOB_LOG (the job's stdout) and CONTINUE_STEP (ROLLBACK's step + 1, for the marks).

A mark says `exit=N` and any number of `expect="…"` (stdout), `stderr_expect="…"` and
`runner_expect="…"` (the live `ckpt-ha run`'s stderr, waited for) markers; `$VARS` in markers
are expanded with the bound values.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[3]
RUNBOOK = ROOT / "docs" / "RUNBOOK.md"
BLOCK = re.compile(r"<!-- test: (?P<mark>[^\n]*?) -->\n```sh\n(?P<script>.*?)```", re.DOTALL)
ANCHOR = re.compile(r'<a id="(?P<anchor>[a-z0-9-]+)"></a>')
R12_STEPS = (
    "locate-job",
    "list-valid-checkpoints",
    "spot-corrupt-and-quarantined",
    "choose-rollback-version",
    "prepare-environment",
    "submit-restore",
    "verify-continue-position",
    "stop-runaway-retries",
    "release-quarantined-checkpoint",
    "transfer-ownership",
)
TRAIN = [
    "-m", "ckpt_ha.lab.examples.numpy_mlp",
    "--steps", "200", "--checkpoint-every", "10", "--sleep-per-step", "0.05",
]  # fmt: skip


@dataclass
class Step:
    anchor: str
    script: str
    exit: int = 0
    expect: list[str] = field(default_factory=list)
    stderr_expect: list[str] = field(default_factory=list)
    runner_expect: list[str] = field(default_factory=list)


def steps() -> list[Step]:
    text = RUNBOOK.read_text()
    anchors = [(m.start(), m["anchor"]) for m in ANCHOR.finditer(text)]
    found = []
    for m in BLOCK.finditer(text):
        anchor = [a for at, a in anchors if at < m.start()][-1]
        step = Step(anchor=anchor, script=m["script"])
        for item in shlex.split(m["mark"]):
            key, _, value = item.partition("=")
            if key == "exit":
                step.exit = int(value)
            else:
                getattr(step, key).append(value)
        found.append(step)
    return found


def test_the_runbook_has_every_step_with_command_permission_output_failures_and_owner() -> None:
    text = RUNBOOK.read_text()
    sections = re.split(r'(?=<a id="[a-z0-9-]+"></a>\n###)', text)
    by_anchor = {ANCHOR.match(s)["anchor"]: s for s in sections if ANCHOR.match(s)}  # type: ignore[index]
    tested = {s.anchor for s in steps()}
    for anchor in R12_STEPS:
        section = by_anchor[anchor]
        assert "ckpt-ha " in section, anchor
        assert "Permission:" in section, anchor
        assert "Expect" in section, anchor
        assert "Failure branch" in section, anchor
        assert re.search(r"Owner: \*\*(platform|training|data|on-call)\*\*", section), anchor
        assert anchor in tested, f"{anchor}: no command of this step is run by the test"


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
    env["CKPT_HA_HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CKPT_HA_ACTOR"] = "runbook-test"
    return env


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def records(env: dict[str, str], job: str) -> list[dict[str, Any]]:
    done = cli(env, "checkpoints", "list", "--job", job, "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return rows


def wait_for(what: str, check: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ckpt-ha-home"
    yield path
    cli(cli_env(path), "down")


# Some 30 CLI processes, a training job and its restore, one after another: beside the other
# system-tier worker on 2 cores this takes two to three minutes.
@pytest.mark.timeout(360)
def test_every_runbook_command_runs_literally_against_a_live_stack(
    home: Path, tmp_path: Path
) -> None:
    env = cli_env(home)
    up = cli(env, "up")
    assert up.returncode == 0, up.stdout + up.stderr

    suffix = uuid.uuid4().hex[:8]
    job, run = f"runbook-{suffix}", f"run-{suffix}"
    job_log, runner_log = tmp_path / "job.out", tmp_path / "runner.err"
    with job_log.open("wb") as out, runner_log.open("wb") as err:
        runner = subprocess.Popen(
            [sys.executable, "-m", "ckpt_ha.cli.main", "run", "--job", job, "--run-id", run,
             "--", sys.executable, *TRAIN],
            env=env, cwd=ROOT, stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        _runbook(env, home, job, run, job_log, runner_log, runner)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=30)


def _freeze(env: dict[str, str], home: Path, job: str, run: str) -> list[dict[str, Any]]:
    """Stop the live attempt (SIGSTOP) at a moment when all its checkpoints are valid."""
    attempt = home / "runs" / job / run / "attempt.json"
    wait_for("three valid checkpoints", lambda: len(records(env, job)) >= 3)
    for _ in range(20):
        pid = int(json.loads(attempt.read_text())["handle"])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)  # let the last commit's verification land
        rows = records(env, job)
        if rows and all(r["state"] == "valid" for r in rows):
            return rows
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
    raise AssertionError("the live job never paused between checkpoints")


def _runbook(
    env: dict[str, str],
    home: Path,
    job: str,
    run: str,
    job_log: Path,
    runner_log: Path,
    runner: subprocess.Popen[bytes],
) -> None:
    rows = sorted(_freeze(env, home, job, run), key=lambda r: r["step"], reverse=True)
    newest, rollback = rows[0], rows[1]
    project, new_project = f"team-{job}", f"new-team-{job}"
    setup = cli(env, "owner", "transfer", "--to", project, "--job", job, "--reason", "setup")
    assert setup.returncode == 0, setup.stderr
    bound = {
        "JOB": job,
        "RUN": run,
        "PROJECT": project,
        "NEW_PROJECT": new_project,
        "CKPT": newest["checkpoint_id"],
        "ROLLBACK": rollback["checkpoint_id"],
        "CKPT_DIR": rollback["uri"].removeprefix("file://"),
        "JOB_LOG": str(job_log),
        "CONTINUE_STEP": str(rollback["step"] + 1),
    }
    shell_env = {**env, **bound}

    ran = steps()
    assert len(ran) >= 25
    for step in ran:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", step.script],
            env=shell_env, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        said = f"#{step.anchor}: {step.script!r}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        assert done.returncode == step.exit, said
        for marker in step.expect:
            assert Template(marker).substitute(bound) in done.stdout, (marker, said)
        for marker in step.stderr_expect:
            assert Template(marker).substitute(bound) in done.stderr, (marker, said)
        for marker in step.runner_expect:
            wanted = Template(marker).substitute(bound)
            wait_for(f"{wanted!r} from the runner", lambda w=wanted: w in runner_log.read_text())
            # The resumed attempt finishes the job; later steps meet a settled registry.
            assert runner.wait(timeout=120) == 0, runner_log.read_text()
    # The restore continued exactly after the restored step.
    first = next(
        json.loads(line)
        for line in job_log.read_text().splitlines()
        if line.startswith("{") and json.loads(line)["attempt"] == 2
    )
    assert first["step"] == rollback["step"] + 1
    assert f"resumed from {rollback['checkpoint_id']} at step {rollback['step']}" in (
        runner_log.read_text()
    )
