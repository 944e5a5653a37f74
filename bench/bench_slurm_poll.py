"""Calls per second to slurmctld while a process's Slurm adapters wait on ``--jobs`` jobs (issue
33): one ``squeue`` per interval for all of them (`ckpt_ha.runner.slurm_poll.SlurmPoller`)
against one ``scontrol show job`` per job per interval, as each adapter polled before.

Two parts. Counted: ``--jobs`` waiters, each asking its job's state once per interval for
``--seconds`` of simulated time, against a counting fake cluster: the calls per second each way;
then the same jobs waited on by ``--jobs`` runner processes, one job each, sharing one directory
(simulated in this process: one poller object per "process", each with its own registration, all
sharing a temporary directory): the squeue calls/s to slurmctld, against one per process per
interval before. Real: a private single-node Slurm (``ckpt_ha.lab.devstack.slurm``, installed by
``scripts/slurm-tools``) with ``--submit`` real jobs; the same ``--jobs`` ids (the real ones and
made-up ones beyond them) asked through a real poller for ``--real-seconds``: its calls per
second, what one ``squeue`` of that many ids costs, and what one ``scontrol show job`` costs
(the price of the old way, 2 per job per second). Usage:
    .venv/bin/python bench/bench_slurm_poll.py [--jobs 10000] [--seconds 60] [--submit 20]
        [--real-seconds 5] [--processes-seconds 10] [--no-real]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ckpt_ha.lab.devstack import slurm
from ckpt_ha.runner.slurm_poll import POLL_S, SlurmPoller, run_command


class Counting:
    """A fake cluster where every job runs; counts the calls by command."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.CompletedProcess[str]:
        name = os.path.basename(argv[0])
        self.calls[name] = self.calls.get(name, 0) + 1
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        return subprocess.CompletedProcess(argv, 0, "".join(f"{i}|RUNNING|None\n" for i in ids), "")


def counted(jobs: int, seconds: float) -> None:
    fake, now = Counting(), [0.0]
    poller = SlurmPoller(fake, env={}, interval_s=POLL_S, clock=lambda: now[0])
    ids = [str(100_000 + i) for i in range(jobs)]
    for i in ids:
        poller.watch(i)
    rounds = int(seconds / POLL_S)
    for _ in range(rounds):
        for i in ids:
            poller.state(i)
        now[0] += POLL_S
    old = jobs / POLL_S
    print(
        f"counted, {jobs:,} jobs waited on for {seconds:.0f} s (poll every {POLL_S} s): "
        f"{fake.calls.get('squeue', 0) / seconds:.1f} squeue calls/s to slurmctld, "
        f"against {old:,.0f} scontrol calls/s one job at a time ({old * seconds:,.0f} calls)"
    )


def processes(jobs: int, seconds: float) -> None:
    fake, now = Counting(), [0.0]
    with tempfile.TemporaryDirectory() as share:
        pollers = [
            SlurmPoller(
                fake,
                env={},
                interval_s=POLL_S,
                clock=lambda: now[0],
                share=Path(share),
                pid=n + 1,
                alive=lambda pid: True,
            )
            for n in range(jobs)
        ]
        ids = [str(100_000 + i) for i in range(jobs)]
        for poller, i in zip(pollers, ids, strict=True):
            poller.watch(i)
        t0 = time.perf_counter()
        rounds = int(seconds / POLL_S)
        for _ in range(rounds):
            for poller, i in zip(pollers, ids, strict=True):
                poller.state(i)
            now[0] += POLL_S
        took = time.perf_counter() - t0
    calls = fake.calls.get("squeue", 0)
    print(
        f"counted, {jobs:,} runner processes waiting on one job each for {seconds:.0f} s, "
        f"sharing one directory (simulated: {jobs:,} poller objects in one process): "
        f"{calls / seconds:.1f} squeue calls/s to slurmctld ({calls} calls), against "
        f"{jobs / POLL_S:,.0f} calls/s with a poller per process alone; reading the shared "
        f"answer cost {1e3 * took / (rounds * jobs):.2f} ms per waiter per interval here"
    )


def real(jobs: int, submit: int, seconds: float) -> None:
    with slurm.cluster() as cluster:
        env = {**os.environ, **cluster.env}
        submitted = [
            cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 60")
            .strip()
            .split(";")[0]
            for _ in range(submit)
        ]
        first = max(int(i) for i in submitted) + 1
        ids = submitted + [str(first + n) for n in range(jobs - len(submitted))]
        squeue = str(slurm.binary("squeue"))
        poller = SlurmPoller(run_command, env=env, interval_s=POLL_S, binary=squeue)
        for i in ids:
            poller.watch(i)
        took: list[float] = []
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            before = poller.calls
            t0 = time.perf_counter()
            for i in ids:
                poller.state(i)
            if poller.calls > before:
                took.append((time.perf_counter() - t0) / (poller.calls - before))
            time.sleep(max(0.0, POLL_S - (time.perf_counter() - t0)))
        elapsed = time.monotonic() - start
        seen: dict[str, int] = {}
        for i in submitted:
            state = poller.state(i)
            name = state[0] if state is not None else "unasked"
            seen[name] = seen.get(name, 0) + 1
        scontrol = []
        for i in submitted[:10]:
            t0 = time.perf_counter()
            cluster.run("scontrol", "show", "job", "-o", i)
            scontrol.append(time.perf_counter() - t0)
        each = statistics.median(scontrol)
        print(
            f"real, a private Slurm ({submit} jobs submitted, {jobs:,} ids asked): "
            f"{poller.calls / elapsed:.1f} squeue calls/s over {elapsed:.1f} s, one squeue of "
            f"{min(jobs, 5000):,} ids {1e3 * statistics.median(took):.0f} ms (median); "
            f"the submitted jobs as squeue last listed them: {seen}; "
            f"one scontrol show job {1e3 * each:.0f} ms, so the old way's "
            f"{jobs / POLL_S:,.0f} calls/s would need {jobs / POLL_S * each:,.0f} s of "
            f"client time every second"
        )
        for i in submitted:
            cluster.run("scancel", i, check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--submit", type=int, default=20)
    ap.add_argument("--real-seconds", type=float, default=5.0)
    ap.add_argument("--processes-seconds", type=float, default=10.0)
    ap.add_argument("--no-real", action="store_true", help="only the counted part")
    args = ap.parse_args()
    counted(args.jobs, args.seconds)
    processes(args.jobs, args.processes_seconds)
    if not args.no_real:
        real(args.jobs, args.submit, args.real_seconds)


if __name__ == "__main__":
    main()
