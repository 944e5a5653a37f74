"""The Slurm adapters of one process share one ``squeue`` per interval (`SlurmPoller`, issue
33): however many jobs they wait on, slurmctld is asked once per interval (per `CHUNK` ids),
and only a job that ended is asked about alone (``scontrol``), once. A fake command runner
stands for the cluster; the real one: ``tests/integration/test_slurm_*.py``."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ckpt_ha.runner import slurm
from ckpt_ha.runner.slurm import SlurmBatch
from ckpt_ha.runner.slurm_poll import (
    ABSENT,
    CHUNK,
    SlurmPoller,
    parse_squeue,
    squeue_argv,
)


class FakeCluster:
    """Answers ``squeue``, ``scontrol show job`` and ``sbatch`` from a table of jobs."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[str, str, str]] = {}  # id -> (state, reason, exit code)
        self.calls: list[str] = []
        self.squeue_fails = False
        self.next_id = 100

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.CompletedProcess[str]:
        name = Path(argv[0]).name
        self.calls.append(name)
        if name == "squeue":
            if self.squeue_fails:
                return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: down")
            ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
            out = "".join(
                f"{i}|{self.jobs[i][0]}|{self.jobs[i][1]}\n" for i in ids if i in self.jobs
            )
            return subprocess.CompletedProcess(argv, 0, out, "")
        if name == "scontrol":
            job = self.jobs.get(argv[-1])
            if job is None:
                return subprocess.CompletedProcess(argv, 1, "", "Invalid job id specified")
            line = f"JobId={argv[-1]} JobState={job[0]} Reason={job[1]} ExitCode={job[2]}"
            return subprocess.CompletedProcess(argv, 0, line, "")
        if name == "sbatch":
            self.next_id += 1
            self.jobs[str(self.next_id)] = ("PENDING", "None", "0:0")
            return subprocess.CompletedProcess(argv, 0, f"{self.next_id}\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ten_thousand_jobs_cost_one_squeue_per_chunk_per_interval() -> None:
    cluster, clock = FakeCluster(), Clock()
    poller = SlurmPoller(cluster, env={}, interval_s=0.5, clock=clock)
    ids = [str(1000 + i) for i in range(10_000)]
    for i in ids:
        cluster.jobs[i] = ("RUNNING", "None", "0:0")
        poller.watch(i)
    for _ in range(4):  # four intervals, every waiter asking once in each
        for i in ids:
            assert poller.state(i) == ("RUNNING", "None")
        clock.now += 0.5
    per_interval = -(-len(ids) // CHUNK)
    assert poller.calls == cluster.calls.count("squeue") == 4 * per_interval == 8
    assert "scontrol" not in cluster.calls  # against 80,000 scontrol calls one job at a time


def test_a_new_job_is_asked_about_at_once_and_a_failure_is_not_a_state() -> None:
    cluster, clock = FakeCluster(), Clock()
    poller = SlurmPoller(cluster, env={}, interval_s=0.5, clock=clock)
    cluster.jobs["1"] = ("RUNNING", "None", "0:0")
    poller.watch("1")
    assert poller.state("1") == ("RUNNING", "None")
    cluster.jobs["2"] = ("PENDING", "Priority", "0:0")
    poller.watch("2")  # within the interval: its first question polls (both ids)
    assert poller.state("2") == ("PENDING", "Priority")
    assert poller.calls == 2
    poller.watch("3")  # not known to squeue: absent (its waiter asks scontrol)
    assert poller.state("3") == ABSENT
    cluster.squeue_fails = True
    clock.now += 0.5
    assert poller.state("1") is None  # could not be asked: try again, never a state
    assert poller.state("2") is None  # the same answer within the interval: no second call
    assert poller.calls == 4
    poller.forget("1")
    cluster.squeue_fails = False
    clock.now += 0.5
    assert poller.state("2") == ("PENDING", "Priority")
    assert squeue_argv("squeue", ["7", "8"])[3] == "--jobs=7,8"
    assert parse_squeue("7|COMPLETED|None\nnoise\n8|FAILED|NonZeroExitCode\n") == {
        "7": ("COMPLETED", "None"),
        "8": ("FAILED", "NonZeroExitCode"),
    }


@pytest.fixture(autouse=True)
def commands_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake cluster answers by command name: no Slurm client needs to be installed."""
    monkeypatch.setattr(slurm, "_binary", lambda name: name)


def test_the_adapter_waits_on_the_shared_squeue_and_reads_the_end_once(tmp_path: Path) -> None:
    """`SlurmBatch.wait`: no ``scontrol`` while squeue says the job runs; once it says the
    job ended, one ``scontrol`` for its exit code and reason."""
    cluster = FakeCluster()
    poller = SlurmPoller(cluster, env={}, interval_s=0.0)
    adapter = SlurmBatch(output_dir=tmp_path, poll_s=0.0, run=cluster, poller=poller)
    adapter.start(["python", "train.py"], {"PATH": "/usr/bin"})
    job = adapter.job_id
    assert job is not None
    polls = 0

    def squeue_then_end(
        argv: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.CompletedProcess[str]:
        nonlocal polls
        if Path(argv[0]).name == "squeue":
            polls += 1
            if polls == 3:
                cluster.jobs[job] = ("NODE_FAIL", "NodeDown", "0:0")
        return cluster(argv, env)

    poller._run = squeue_then_end
    adapter._run = squeue_then_end
    ended = adapter.wait()
    assert (ended.state, ended.reason, ended.reported_by) == ("NODE_FAIL", "NodeDown", "slurm")
    assert cluster.calls.count("scontrol") == 1
    assert cluster.calls.count("squeue") == 3
    assert poller.state(job) is not None  # forgotten once ended: nothing watched
    assert job not in poller._watched


def test_a_forgotten_job_ends_as_unknown(tmp_path: Path) -> None:
    cluster = FakeCluster()
    poller = SlurmPoller(cluster, env={}, interval_s=0.0)
    adapter = SlurmBatch(output_dir=tmp_path, poll_s=0.0, run=cluster, poller=poller)
    adapter.start(["python", "train.py"], {"PATH": "/usr/bin"})
    cluster.jobs.clear()  # slurmctld purged it: squeue lists nothing, scontrol knows nothing
    assert adapter.wait().state == "UNKNOWN"
