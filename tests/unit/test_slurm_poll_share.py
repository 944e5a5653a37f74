"""The processes of a host share one ``squeue`` per interval through a directory (issue 33):
each registers the ids it waits on, whoever finds the answer stale polls the union of them
under a ``flock`` and writes it, the others read it. The "processes" here are separate pollers
(separate registrations, separate pids) sharing one directory, with a fake cluster."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ckpt_ha.runner.slurm_poll import (
    ANSWER,
    DIR_ENV,
    LOCK,
    WAITING,
    SlurmPoller,
    share_dir,
    shared_poller,
)


class Cluster:
    """Every job it knows runs; records each ``squeue``'s ids."""

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}
        self.asked: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.CompletedProcess[str]:
        assert Path(argv[0]).name == "squeue"
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        self.asked.append(ids)
        out = "".join(f"{i}|{self.jobs[i]}|None\n" for i in ids if i in self.jobs)
        return subprocess.CompletedProcess(argv, 0, out, "")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def process(cluster: Cluster, clock: Clock, share: Path, pid: int) -> SlurmPoller:
    """One process's poller: its own pid and registration, the shared directory."""
    return SlurmPoller(
        cluster, env={}, interval_s=0.5, clock=clock, share=share, pid=pid, alive=lambda p: True
    )


def test_processes_share_one_squeue_per_interval(tmp_path: Path) -> None:
    cluster, clock = Cluster(), Clock()
    pollers = [process(cluster, clock, tmp_path, 1000 + n) for n in range(5)]
    mine = {p: [str(10 * n + k) for k in range(3)] for n, p in enumerate(pollers)}
    for poller, ids in mine.items():
        for i in ids:
            cluster.jobs[i] = "RUNNING"
            poller.watch(i)
    assert len(list((tmp_path / WAITING).iterdir())) == 5
    for _ in range(4):  # four intervals, every waiter of every process asking once in each
        for poller, ids in mine.items():
            for i in ids:
                assert poller.state(i) == ("RUNNING", "None")
        clock.now += 0.5
    assert len(cluster.asked) == 4  # against 4 per process, 20, each polling alone
    assert sorted(cluster.asked[0]) == sorted(i for ids in mine.values() for i in ids)
    assert sum(p.calls for p in pollers) == 4
    cluster.jobs["0"] = "COMPLETED"
    assert pollers[3].state("30") == ("RUNNING", "None")  # one poll, for everyone
    assert pollers[0].state("0") == ("COMPLETED", "None")
    assert len(cluster.asked) == 5
    for i in mine[pollers[0]]:
        pollers[0].forget(i)
    assert len(list((tmp_path / WAITING).iterdir())) == 4  # waits on nothing: unregistered


def test_a_process_waiting_on_many_jobs_shares_with_one_waiting_on_few(tmp_path: Path) -> None:
    """(one that waits on many reads the whole answer; one on a few looks for its lines)"""
    cluster, clock = Cluster(), Clock()
    many, few = process(cluster, clock, tmp_path, 1), process(cluster, clock, tmp_path, 2)
    for n in range(100):
        cluster.jobs[str(n)] = "RUNNING"
        many.watch(str(n))
    cluster.jobs["1000"] = "PENDING"
    few.watch("1000")
    few.watch("1001")  # squeue does not list it: absent, covered
    for _ in range(3):
        assert few.state("1000") == ("PENDING", "None")
        assert few.state("1001") == ("", "")
        assert all(many.state(str(n)) == ("RUNNING", "None") for n in range(100))
        clock.now += 0.5
    assert len(cluster.asked) == 3
    assert len(cluster.asked[0]) == 102


def test_a_job_registered_after_the_answer_is_polled_for_at_once(tmp_path: Path) -> None:
    cluster, clock = Cluster(), Clock()
    a, b = process(cluster, clock, tmp_path, 1), process(cluster, clock, tmp_path, 2)
    cluster.jobs.update({"1": "RUNNING", "2": "PENDING"})
    a.watch("1")
    assert a.state("1") == ("RUNNING", "None")
    b.watch("2")  # the answer is fresh but does not cover it
    assert b.state("2") == ("PENDING", "None")
    assert cluster.asked == [["1"], ["1", "2"]]
    assert a.state("1") == ("RUNNING", "None")  # b's answer is fresh and covers it
    assert len(cluster.asked) == 2


def test_a_dead_process_registration_is_ignored_and_removed(tmp_path: Path) -> None:
    cluster, clock = Cluster(), Clock()
    cluster.jobs["1"] = "RUNNING"
    poller = SlurmPoller(
        cluster, env={}, interval_s=0.5, clock=clock, share=tmp_path, pid=1,
        alive=lambda pid: pid != 999_999,
    )  # fmt: skip
    stale = tmp_path / WAITING / "999999.dead"
    stale.write_text("555\n556\n")
    poller.watch("1")
    assert poller.state("1") == ("RUNNING", "None")
    assert cluster.asked == [["1"]]  # not 555, 556
    assert not stale.exists()


def test_a_holder_that_died_with_the_lock_does_not_block_the_others(tmp_path: Path) -> None:
    """The holder is another open of the lock file (``flock`` locks conflict between opens,
    in one process as across processes); its death is what the kernel does then: the file
    closed, the lock released (with a real process killed: tests/integration)."""
    cluster, clock = Cluster(), Clock()
    cluster.jobs.update({"1": "RUNNING", "2": "RUNNING"})
    poller = process(cluster, clock, tmp_path, 1)
    poller.watch("1")
    assert poller.state("1") == ("RUNNING", "None")
    holder = os.open(tmp_path / LOCK, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    clock.now += 0.5
    cluster.jobs["1"] = "COMPLETED"
    # the holder is asking: the previous answer meanwhile, no second squeue
    assert poller.state("1") == ("RUNNING", "None")
    poller.watch("2")
    assert poller.state("2") is None  # not in any answer yet: ask again, never a state
    assert len(cluster.asked) == 1
    os.close(holder)  # it died holding the lock, its answer never written
    assert poller.state("1") == ("COMPLETED", "None")
    assert poller.state("2") == ("RUNNING", "None")
    assert cluster.asked[-1] == ["1", "2"]
    assert len(cluster.asked) == 2


def test_a_corrupt_or_partial_answer_is_polled_anew(tmp_path: Path) -> None:
    cluster, clock = Cluster(), Clock()
    cluster.jobs["1"] = "RUNNING"
    poller = process(cluster, clock, tmp_path, 1)
    poller.watch("1")
    for n, bad in enumerate(
        [
            "ckpt-ha-squeue 1 0.0 1\n1|RUNNING|None\n",  # partial: no end
            "ckpt-ha-squeue 1 x 1\n1|RUNNING|None\nend\n",
            "[]",
            "\x00\xff",
            "",
        ]
    ):
        (tmp_path / ANSWER).write_text(bad)
        assert poller.state("1") == ("RUNNING", "None")
        assert len(cluster.asked) == n + 1
        clock.now += 0.5


def test_the_shared_directory_is_per_user_and_cluster(tmp_path: Path) -> None:
    assert share_dir({DIR_ENV: "off"}, "squeue") is None
    assert share_dir({DIR_ENV: str(tmp_path)}, "squeue") == tmp_path
    one = share_dir({"XDG_RUNTIME_DIR": str(tmp_path), "SLURM_CONF": "/a"}, "squeue")
    other = share_dir({"XDG_RUNTIME_DIR": str(tmp_path), "SLURM_CONF": "/b"}, "squeue")
    assert one is not None
    assert other is not None
    assert one.parent == tmp_path != other
    assert one != other


def test_the_process_poller_shares_through_the_setting_or_polls_alone(tmp_path: Path) -> None:
    shared = shared_poller({DIR_ENV: str(tmp_path / "d"), "SLURM_CONF": str(tmp_path / "a")})
    assert shared._share == tmp_path / "d"
    assert (tmp_path / "d" / WAITING).is_dir()
    (tmp_path / "f").write_text("")  # not a directory: this process polls alone
    alone = shared_poller({DIR_ENV: str(tmp_path / "f"), "SLURM_CONF": str(tmp_path / "b")})
    assert alone._share is None
    assert shared_poller({DIR_ENV: "off", "SLURM_CONF": str(tmp_path / "c")})._share is None


def test_a_removed_directory_leaves_the_process_polling_alone(tmp_path: Path) -> None:
    cluster, clock = Cluster(), Clock()
    cluster.jobs["1"] = "RUNNING"
    poller = process(cluster, clock, tmp_path / "d", 1)
    shutil.rmtree(tmp_path / "d")  # a cleaner of /tmp
    poller.watch("1")
    assert poller.state("1") == ("RUNNING", "None")
    assert cluster.asked == [["1"]]
