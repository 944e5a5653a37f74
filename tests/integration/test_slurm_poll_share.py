"""A process that dies holding the shared poll's lock (issue 33) does not block the others:
the kernel releases its ``flock``. A real process is killed; the cluster is a fake (the Slurm
side: test_slurm_cluster.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ckpt_ha.runner.slurm_poll import LOCK, SlurmPoller


def test_a_killed_lock_holder_releases_the_lock(tmp_path: Path) -> None:
    asked: list[str] = []

    def squeue(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv[3])
        return subprocess.CompletedProcess(argv, 0, "7|RUNNING|None\n", "")

    now = [0.0]
    poller = SlurmPoller(squeue, env={}, interval_s=0.5, clock=lambda: now[0], share=tmp_path)
    poller.watch("7")
    assert poller.state("7") == ("RUNNING", "None")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, time\n"
            f"fd = os.open({str(tmp_path / LOCK)!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        now[0] += 0.5
        assert poller.state("7") == ("RUNNING", "None")  # the previous answer
        assert asked == ["--jobs=7"]  # the holder is asking, not this process
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert poller.state("7") == ("RUNNING", "None")
    assert asked == ["--jobs=7", "--jobs=7"]  # the lock was released with its holder
