"""Slurm node lost: the job runs as a Slurm batch job (`ckpt-ha run --scheduler slurm`) on a
private single-node cluster the drill starts, and its node is set DOWN mid-training.

Slurm ends the job ``NODE_FAIL`` (reason ``NodeDown``); the adapter reports ``job.failed``
cause ``node_lost`` (``reported_by`` slurm), the coordinator plans the last valid checkpoint and
the runner submits a new batch job with the restore target, which runs once the node is back
(``ReturnToService=2``: as soon as its slurmd answers) and continues from it.

Needs Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (``scripts/slurm-tools``
installs them; ``scripts/bootstrap`` does not), so ``--scenario all`` leaves it out
(`IN_ALL`); ``ckpt-ha drill --scenario slurm-node-lost`` runs it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ckpt_ha.contracts.job import JobFailedV2
from ckpt_ha.lab.devstack import slurm
from ckpt_ha.lab.drill.assess import assess_restore, judged
from ckpt_ha.lab.drill.harness import (
    Drill,
    DrillFailed,
    as_awaitable,
    policy,
    progress_at_least,
    resumed_after,
    valid_count,
)

NAME = "slurm-node-lost"
FAULT = "the Slurm node the job runs on is set DOWN (scontrol update state=down) mid-training"
"""The one variable this drill changes; everything else is the baseline."""
EXPECTED_ALERT: str | None = None
IN_ALL = False
"""Not part of ``--scenario all``: it needs Slurm, which ``scripts/bootstrap`` does not install."""


async def run(drill: Drill) -> dict[str, Any]:
    """Set the node of a running Slurm job DOWN; the system must restore the last valid
    checkpoint in a new batch job and continue."""
    cluster_stack = contextlib.ExitStack()
    try:
        cluster = cluster_stack.enter_context(slurm.cluster())
    except slurm.SlurmError as exc:
        why = f"no private Slurm cluster (scripts/slurm-tools installs Slurm): {exc}"
        raise DrillFailed(why) from None
    drill.progress(f"private Slurm cluster up in {cluster.startup_s:.1f}s ({cluster.conf})")
    registry = drill.registry()
    try:
        drill.launch(
            policy(),
            ["--steps", "90", "--checkpoint-every", "10", "--sleep-per-step", "0.05"],
            cluster.env,
            runner_args=["--scheduler", "slurm"],
        )
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")

        def running() -> str | None:
            jobs = cluster.jobs()
            ok = jobs and cluster.job(jobs[0]).get("JobState") == "RUNNING"
            return jobs[0] if ok else None

        lost = await drill.until(lambda: as_awaitable(running()), "the Slurm job running")
        cluster.run("scontrol", "update", f"nodename={slurm.NODE}", "state=down",
                    "reason=ckpt-ha drill")  # fmt: skip
        fault = drill.fault(f"Slurm node {slurm.NODE} set DOWN under job {lost}")
        await drill.until(lambda: resumed_after(drill, fault), "the resume verdict")
        code = await drill.wait_exit()
        events = await drill.events()
        records = {job: cluster.job(job) for job in _submitted(cluster)}
    finally:
        drill.stop()
        await registry.close()
        cluster_stack.close()  # cancels what still runs, stops the daemons, removes the folder
    phase = assess_restore(NAME, events, drill.job, fault)
    result = phase.to_json()
    failures = [e.data for e in events if isinstance(e.data, JobFailedV2)]
    slurm_jobs = {
        job: {k: r.get(k) for k in ("JobState", "Reason", "ExitCode", "Partition")}
        for job, r in records.items()
    }
    checks = {
        "the lost job ended NODE_FAIL": slurm_jobs.get(lost, {}).get("JobState") == "NODE_FAIL",
        "job.failed cause node_lost, reported by slurm": [
            (f.cause.value, f.reported_by) for f in failures
        ]
        == [("node_lost", "slurm")],
        "a new batch job completed": any(
            job != lost and r["JobState"] == "COMPLETED" for job, r in slurm_jobs.items()
        ),
        "the runner exited 0": code == 0,
    }
    result["slurm"] = {"node": slurm.NODE, "jobs": slurm_jobs}
    result["job"], result["job_exit_code"] = drill.job, code
    return judged(result, checks, phases=phase.verdict == "pass")


def _submitted(cluster: slurm.SlurmCluster) -> list[str]:
    """Every job the cluster ran (``MinJobAge`` keeps finished ones visible)."""
    out = cluster.run("scontrol", "show", "job", "-o", check=False)
    ids = [slurm.parse_record(line).get("JobId", "") for line in out.splitlines()]
    return [job for job in ids if job]
