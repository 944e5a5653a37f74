"""A real single-node Slurm cluster for tests, and a probe batch job that records what it sees.

The ``slurm`` fixture (session-scoped: one cluster for the whole run, started in about a
second) installs the packages through ``scripts/slurm-tools`` when they are missing and fails
the test when that is impossible: never a skip. Register it with
``pytest_plugins`` (tests/conftest.py does). Each test gets a `Probe`
through the ``probe`` fixture, which cancels whatever the test left on the cluster and checks
that the node is IDLE again before the next test.

The probe job (``sbatch`` of `PROBE_SCRIPT`) writes, per job id and restart count, the SLURM_*
variables it got, a ``started`` mark once its traps are set, and each signal it receives; it
exits 143 on SIGTERM (as a program that just dies of it would say), ``PROBE_EXIT`` at once if
set, and otherwise runs until it is stopped.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from ckpt_ha.lab.devstack import slurm
from ckpt_ha.lab.devstack.slurm import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
_T = TypeVar("_T")

PROBE_SCRIPT = """#!/bin/bash
out="$PROBE_DIR/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"
for sig in CONT INT HUP USR1 USR2; do trap "echo $sig >> '$out.signals'" "$sig"; done
trap "echo TERM >> '$out.signals'; exit 143" TERM
env | grep '^SLURM_' | sort > "$out.env"
echo "$$" > "$out.started"
if [ -n "${PROBE_EXIT:-}" ]; then exit "$PROBE_EXIT"; fi
while :; do sleep 0.1 & wait $!; done
"""


def install() -> None:
    """Install Slurm and MUNGE if missing (``scripts/slurm-tools``); fail the test if that fails."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "slurm-tools")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:  # a missing tool fails the test, like a missing service
        pytest.fail(f"Slurm and MUNGE unavailable: {done.stderr[-1500:]}")


def wait_for(what: str, get: Callable[[], _T | None], timeout: float = 20) -> _T:
    """Poll ``get`` until it returns something other than None; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


@dataclass(frozen=True)
class Epilog:
    """What one run of the controller's epilog saw: its environment and the job's record."""

    env: dict[str, str]
    job: dict[str, str]


@dataclass(frozen=True)
class Probe:
    """Submits probe jobs to ``cluster`` and reads what they and the epilog recorded."""

    cluster: SlurmCluster
    folder: Path

    def submit(self, *sbatch: str, exit_code: int | None = None) -> str:
        """``sbatch`` the probe with extra options (e.g. ``--no-requeue``); its job id."""
        self.folder.mkdir(parents=True, exist_ok=True)
        script = self.folder / "probe.sh"
        if not script.exists():
            script.write_text(PROBE_SCRIPT)
            script.chmod(0o755)
        export = f"ALL,PROBE_DIR={self.folder}"
        if exit_code is not None:
            export += f",PROBE_EXIT={exit_code}"
        out = self.cluster.run(
            "sbatch",
            "--parsable",
            f"--export={export}",
            f"--output={self.folder}/%j.out",
            *sbatch,
            str(script),
        )
        return out.strip().split(";")[0]

    def state(self, job_id: str) -> dict[str, str]:
        return self.cluster.job(job_id)

    def wait_state(self, job_id: str, *states: str, timeout: float = 20) -> dict[str, str]:
        """The job's record once its ``JobState`` is one of ``states``."""

        def reached() -> dict[str, str] | None:
            record = self.cluster.job(job_id)
            return record if record.get("JobState") in states else None

        return wait_for(f"job {job_id} in {states}", reached, timeout)

    def wait_started(self, job_id: str, restart: int = 0, timeout: float = 20) -> int:
        """The pid of the probe's shell once it has set its traps (run ``restart``)."""
        mark = self.folder / f"{job_id}.{restart}.started"

        def started() -> int | None:
            text = mark.read_text().strip() if mark.exists() else ""
            return int(text) if text else None

        return wait_for(f"job {job_id} run {restart} to start", started, timeout)

    def signals(self, job_id: str, restart: int = 0) -> list[str]:
        path = self.folder / f"{job_id}.{restart}.signals"
        return path.read_text().split() if path.exists() else []

    def job_env(self, job_id: str, restart: int = 0) -> dict[str, str]:
        path = self.folder / f"{job_id}.{restart}.env"
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)

    def epilogs(self, job_id: str, count: int = 1, timeout: float = 20) -> list[Epilog]:
        """The first ``count`` epilog runs for ``job_id``, oldest first (waits for them)."""
        folder = self.cluster.home / "epilog"

        def recorded() -> list[Epilog] | None:
            runs = sorted(folder.glob(f"{job_id}.*.job"), key=lambda p: int(p.name.split(".")[1]))
            if len(runs) < count:
                return None
            result = []
            for run in runs[:count]:
                env_file = run.with_name(run.name.removesuffix(".job") + ".env")
                env = dict(
                    line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line
                )
                result.append(Epilog(env=env, job=slurm.parse_record(run.read_text().strip())))
            return result

        return wait_for(f"{count} epilog run(s) of job {job_id}", recorded, timeout)

    def clean(self) -> None:
        """Cancel every job left and wait until the queue is empty and the node IDLE."""
        left = self.cluster.jobs()
        if left:
            self.cluster.run("scancel", *left)
        wait_for("an empty queue", lambda: True if not self.cluster.jobs() else None, 30)

        def idle() -> bool | None:
            state = self.cluster.node().get("State", "")
            return True if state == "IDLE" else None

        wait_for("the node to be IDLE", idle, 30)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    install()
    with slurm.cluster(epilog=True) as running:
        yield running


@pytest.fixture
def probe(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Probe]:
    made = Probe(cluster=slurm_cluster, folder=tmp_path / "probe")
    yield made
    made.clean()
