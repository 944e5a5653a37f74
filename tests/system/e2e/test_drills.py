"""The restore path end to end, across processes: `ckpt-ha drill` runs the example job under
`ckpt-ha run` on the embedded stack (its own nats-server, redis-server and the five services),
injects one fault, and reports evidence read back from the event stream.

One stack serves every drill of this module (started by the first drill, stopped at the end).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG, build
from ckpt_ha.contracts.job import JobFailedV1
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.contracts.subjects import job_token
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.local_stack import StackState
from tests.support import slurm as slurm_support

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LEVELS = ("generated", "verified", "registered", "loadable", "continued")


def cli(home: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL")}
    env["CKPT_HA_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("drills") / "ckpt-ha-home"
    yield path
    cli(path, "down", timeout=120)


def drill(home: Path, scenario: str, *extra: str) -> dict[str, Any]:
    done = cli(home, "drill", "--scenario", scenario, "--json", "--budget", "300", *extra)
    assert done.stdout, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert f"[{scenario}" in done.stderr  # progress lines while it runs
    assert done.returncode == (0 if result["verdict"] == "pass" else 1)
    assert result["verdict"] == "pass", (result.get("reasons"), done.stderr[-2000:])
    return result


def assert_restored(phase: dict[str, Any]) -> None:
    for name in LEVELS:
        level = phase["levels"][name]
        assert level["passed"], (name, phase["reasons"])
        assert level["evidence"]["event_id"]  # each level has its own event
    ids = [phase["levels"][n]["evidence"]["event_id"] for n in LEVELS]
    assert len(set(ids)) == len(LEVELS)
    assert phase["restored_from"] is not None
    assert phase["continue_step"] is not None
    assert phase["recompute_steps"] is not None


def test_node_exit_is_restored_and_continues_also_after_a_kill_mid_write(home: Path) -> None:
    result = drill(home, "node-exit")
    assert result["scenario"] == "node-exit"
    first, mid_write = result["phases"]
    for phase in (first, mid_write):
        assert_restored(phase)
        # The job resumes right after the checkpoint's step, and lost only the steps after it.
        step = phase["levels"]["loadable"]["evidence"]["step"]
        assert phase["continue_step"] == step + 1
        assert phase["restored_from"] == phase["last_valid_checkpoint"]
    # The checkpoint being written at the second kill never became a restore candidate.
    writing = [t for t in mid_write["timeline"] if t["event"].endswith("checkpoint.writing.v1")]
    killed_mid_write = [t for t in writing if t["t_seconds"] is not None and t["t_seconds"] < 0]
    assert killed_mid_write
    assert mid_write["restored_from"] not in killed_mid_write[-1]["what"]
    assert result["job_exit_code"] == 0
    # Recorded besides the levels: no manual action, what was reclaimed, the metrics after.
    assert result["manual_actions"] == []
    assert result["resources_reclaimed"]["event_ids"]
    assert result["resources_reclaimed"]["unreclaimable"] == []
    restarts = [
        v for k, v in result["metrics_after"].items() if k.startswith("ckpt_ha_job_restarts")
    ]
    assert restarts, sorted(result["metrics_after"])
    assert max(restarts) >= 2
    comparisons = first["levels"]["continued"]["evidence"]["comparisons"]
    names = [c["name"] for c in comparisons]
    # Recomputed steps match the pre-failure run exactly: loss, data position and RNG state.
    assert any(n.endswith(": loss") for n in names), names
    assert any(n.endswith(": data_position") for n in names), names
    assert any(n.endswith(": rng_fingerprint") for n in names), names
    assert all(c["ok"] for c in comparisons)
    assert all(c["tolerance"] == 0 for c in comparisons if c["name"].endswith(": loss"))


def test_a_storage_outage_fakes_no_checkpoint_blames_infrastructure_and_the_restore_waits(
    home: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    result = drill(home, "storage-outage", "--report", str(report))
    assert result["scenario"] == "storage-outage"
    assert all(result["checks"].values()), result["checks"]
    write = result["interrupted_write"]
    # No fake-complete checkpoint: the write storage vanished under never committed.
    assert write["committed_or_registered"] == []
    assert write["state"] != "valid"
    assert any(w["side"] == "infrastructure" for w in write["write_failed"])
    assert "storage" in write["write_failed"][0]["reason"]
    # The restore waited for storage (no failed load, nothing quarantined) and resumed from the
    # last valid checkpoint, proven on all five levels.
    _, restore = result["phases"]
    assert_restored(restore)
    assert restore["restored_from"] == restore["last_valid_checkpoint"]
    wait = result["restore_wait"]
    assert wait["load_failed"] == []
    assert wait["quarantined"] == []
    assert wait["loaded"][0]["time"] >= wait["storage_back"]
    assert result["job_exit_code"] == 0
    assert result["baseline"]["config"]["seed"] == 0
    assert result["fault"]

    # --report: the four files, the JSON is what --json printed, the page stands alone.
    names = sorted(p.name for p in report.iterdir())
    assert names == ["junit.xml", "report.html", "report.json", "report.md"]
    assert json.loads((report / "report.json").read_text()) == result
    page = (report / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)
    assert "<svg" in page
    assert 'class="baseline"' in page
    assert 'class="drill"' in page
    assert 'class="faults"' in page
    assert 'class="resumes"' in page
    md = (report / "report.md").read_text()
    assert "## storage-outage: PASS" in md
    # The write phase has no restore of its own: its five levels are not expected, not failed.
    assert md.count("| not expected |") == 5
    assert "| FAIL |" not in md
    junit = ET.fromstring((report / "junit.xml").read_text())
    assert [(c.get("name"), c.find("failure")) for c in junit.iter("testcase")] == [
        ("storage-outage", None)
    ]
    # The drill run matches the baseline (same seed, uninterrupted) step for step: a restore
    # from a valid checkpoint changes no loss.
    baseline = {int(s): v for s, v in result["curves"]["baseline"]}
    drilled = result["curves"]["drill"]
    assert len(drilled) > len(baseline)  # recomputed steps after the resume
    assert all(baseline[int(s)] == v for s, v, _ in drilled)


def test_a_checkpoint_corrupted_after_registration_is_caught_at_load_and_falls_back(
    home: Path,
) -> None:
    result = drill(home, "corrupt-checkpoint")
    assert_restored(result)
    assert result["damaged_state"] == "quarantined"
    # The stack's Prometheus (tools unpacked by scripts/test) saw the page-worthy alert.
    assert result["alerts_fired"]["available"], result["alerts_fired"]
    assert result["alerts_fired"]["alerts"]["CkptHaCheckpointCorrupt"]["state"] == "firing"
    assert result["alerts_fired"]["alerts"]["CkptHaCheckpointCorrupt"]["severity"] == "critical"
    assert result["load_failed"]
    assert "checksum" in result["load_failed"][0]["reason"]
    assert result["restored_from"] != result["damaged_checkpoint"]


def test_a_lost_primary_storage_is_restored_from_the_copy_of_the_newest_checkpoint(
    home: Path,
) -> None:
    """Issue 29: the job's primary storage wiped after its checkpoints were copied to the
    replica (the local stack's ``<root>-copies``); the restore loads the newest valid
    checkpoint from its copy, not an older one, and continuity is verified."""
    result = drill(home, "storage-lost")
    assert_restored(result)
    assert result["restored_from"] == result["newest_valid_checkpoint"]
    assert result["plan"]["checkpoint_uri"] == result["copy"]
    assert "-copies/" in result["copy"]
    assert any("is missing" in r and "verified copy" in r for r in result["plan"]["reasons"])
    assert all(result["checks"].values()), result["checks"]


def test_a_restart_loop_escalates_and_retries_stop(home: Path) -> None:
    result = drill(home, "restart-loop")
    assert result["escalation"]["reason"] in {"restart_loop", "same_failure_repeating"}
    assert "runbook" in result["escalation"]["next_step"].lower()
    assert result["job_exit_code"] == 6  # escalated (the exit-code table; 3 is unreachable)
    assert result["alerts_fired"]["alerts"]["CkptHaRestartLoop"]["state"] == "firing"


def test_a_changed_environment_is_unknown_and_not_resumed(home: Path) -> None:
    result = drill(home, "env-mismatch")
    assert result["escalation"]["reason"] == "compatibility_unknown"
    assert "framework_version" in json.dumps(result["escalation"])
    planned = [t for t in result["timeline"] if ".resume.planned.v" in t["event"]]
    assert planned == []


def test_torchrun_dcp_loses_a_rank_mid_training_and_mid_save_and_resumes_exactly(
    home: Path,
) -> None:
    """R7/R10 on a real multi-rank job: torchrun with 2 gloo ranks, PyTorch DCP through
    ckpt_ha.sdk.dcp. The rank's own cause is reported, every rank loads the same checkpoint and
    the recomputed steps match the pre-failure run bit for bit."""
    result = drill(home, "torchrun-dcp")
    first, mid_save = result["phases"]
    for phase in (first, mid_save):
        assert_restored(phase)
        assert phase["restored_from"] == phase["last_valid_checkpoint"]
        comparisons = phase["levels"]["continued"]["evidence"]["comparisons"]
        losses = [c for c in comparisons if c["name"].endswith(": loss")]
        assert losses, comparisons
        assert all(c["ok"] and c["tolerance"] == 0 for c in losses)
    assert [f["cause"] for f in result["failures"]] == ["node_exit", "node_exit"]
    assert all("rank 1" in f["detail"] for f in result["failures"])
    assert result["partial_checkpoint"]["committed_or_registered"] == []
    assert result["partial_checkpoint"]["ended_failed"], result["partial_checkpoint"]
    # The report carries the loss curve of the drill against the uninterrupted baseline.
    assert result["curves"]["baseline"]
    assert result["curves"]["drill"]
    assert result["baseline"]["resources"]["processes"] == 2


def test_a_rank_that_hangs_is_detected_stopped_and_resumed_exactly(home: Path) -> None:
    """Issue 28: a rank of a 2-rank torchrun job sleeps inside training, every process alive.
    No configuration: the runner's threshold comes from the job's own steps; it stops the
    group, reports the hang (rank, last step), and the relaunch continues bit for bit."""
    result = drill(home, "hang")
    assert_restored(result)
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert all(result["checks"].values()), result["checks"]
    hang = result["hang"]
    assert hang["stalled_ranks"] == [1]
    assert hang["last_step"] == 29
    assert hang["threshold_s"] == 30.0
    assert hang["survivors"] == []
    comparisons = result["levels"]["continued"]["evidence"]["comparisons"]
    assert [c for c in comparisons if c["name"].endswith(": loss")]
    assert all(c["ok"] for c in comparisons)


def test_a_2_rank_dcp_job_taken_over_on_1_rank_is_replanned_as_a_reshard(home: Path) -> None:
    """Issue 28: the host of a 2-rank DCP job is lost and `ckpt-ha run --resume` takes the run
    over on 1 rank. The plan decided for the failed attempt (exact) is re-stated for the one that
    loads it (compatible, "reshard 2→1"); the global state is restored at the checkpoint's step
    and data position, and the resumed steps match the 2-rank run to float32 rounding."""
    result = drill(home, "reshard")
    assert_restored(result)
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert all(result["checks"].values()), result["checks"]
    reshard = result["reshard"]
    assert reshard["failure"] == "lost"
    assert (reshard["planned_for_the_failed_attempt"], reshard["restated_for_the_loader"]) == (
        "exact_resume", "compatible_resume",
    )  # fmt: skip
    assert (reshard["loaded_world_size"], reshard["written_world_size"]) == (1, 2)
    comparisons = result["levels"]["continued"]["evidence"]["comparisons"]
    losses = [c for c in comparisons if c["name"].endswith(": loss")]
    assert losses, comparisons
    assert all(c["ok"] for c in comparisons)
    assert result["baseline"]["resources"]["processes"] == 2


def test_a_trainer_killed_mid_save_resumes_from_the_newest_complete_checkpoint(
    home: Path,
) -> None:
    result = drill(home, "hf-trainer")
    assert_restored(result)
    assert result["partial_checkpoint"]["committed_or_registered"] == []
    assert result["partial_checkpoint"]["ended_failed"], result["partial_checkpoint"]
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert result["curves"]["baseline"]
    assert result["curves"]["drill"]
    assert "transformers" in result["baseline"]["environment"]


def test_a_trainers_own_rotation_is_recorded_as_its_writers_deletion_never_damage(
    home: Path,
) -> None:
    """A real Trainer with ``save_total_limit=2`` under `ckpt-ha run` (issue 28): the folders it
    rotates away are deleted by the job (a tombstone, the job as actor), never corrupt or
    quarantined; the newest two stay valid."""
    assert cli(home, "stack", "up").returncode == 0
    job = f"hf-rotate-{os.getpid()}"
    done = cli(
        home, "run", "--job", job, "--", sys.executable, "-m", "ckpt_ha.lab.examples.hf_gpt2",
        "--steps", "30", "--save-steps", "10", "--save-total-limit", "2", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    def records() -> dict[int, dict[str, Any]]:
        listed = cli(home, "checkpoint", "list", "--job", job, "--json")
        assert listed.returncode == 0, listed.stderr
        return {r["step"]: r for r in json.loads(listed.stdout)}

    deadline = time.monotonic() + 90  # the watcher decides 15 s after a folder went
    found = records()
    while time.monotonic() < deadline and found.get(10, {}).get("state") != "deleted":
        time.sleep(2)
        found = records()
    states = {step: r["state"] for step, r in found.items()}
    assert states == {10: "deleted", 20: "valid", 30: "valid"}, states
    for step in (10,):
        tombstone = found[step]["tombstone"]
        assert (tombstone["actor"], tombstone["policy"]) == (f"job:{job}", "writer-rotation")
        assert "deleted by its writer" in tombstone["reason"]
        assert all(h["state"] not in ("corrupt", "quarantined") for h in found[step]["history"])


def test_a_slurm_node_lost_is_classified_resubmitted_with_the_restore_target_and_continues(
    home: Path,
) -> None:
    """`ckpt-ha drill --scenario slurm-node-lost`: the drill starts its own private Slurm
    cluster (the test command installs Slurm: scripts/slurm-tools), runs the job as a batch job
    and sets its node DOWN; the five levels, and Slurm's own record of both batch jobs."""
    slurm_support.install()  # a missing Slurm fails the test, never skips it
    result = drill(home, "slurm-node-lost")
    assert_restored(result)
    assert result["restored_from"] == result["last_valid_checkpoint"]
    assert all(result["checks"].values()), result["checks"]
    states = sorted(j["JobState"] for j in result["slurm"]["jobs"].values())
    assert states == ["COMPLETED", "NODE_FAIL"]
    assert any("set DOWN" in f["what"] for f in result["marks"]["faults"]), result["marks"]
    assert result["job_exit_code"] == 0


async def _events(state: StackState, job: str) -> list[Any]:
    events, _ = await read_events(
        local_stack.bus_config(state), CATALOG, f"ckpt.ev.*.*.*.{job_token(job)}", idle_timeout=2
    )
    return events


async def _republish(state: StackState, failed: JobFailedV1, copies: int) -> None:
    # A scheduler reporting one failure several times: it publishes as the runner does.
    bus = Bus(local_stack.bus_config(state, local_stack.RUNNER), "e2e-scheduler")
    await bus.broker.start()
    try:
        for i in range(copies):  # a scheduler that reports one failure several times
            await bus.publish(build(failed, source="e2e", time=datetime.now(UTC), key=f"dup-{i}"))
    finally:
        await bus.broker.stop()


def test_duplicated_job_failed_gives_one_plan(home: Path) -> None:
    state = StackState.load(home)
    assert state is not None, "the drills above started the stack"
    drills = sorted(p.name for p in (home / "drills").iterdir() if "node-exit" in p.name)
    assert drills, "the node-exit drill ran first"
    job = drills[-1]
    events = asyncio.run(_events(state, job))
    failed = [e.data for e in events if isinstance(e.data, JobFailedV1)]
    plans_before = [e.data for e in events if isinstance(e.data, ResumePlannedV2)]
    assert failed
    asyncio.run(_republish(state, failed[0], copies=3))

    async def settle() -> list[Any]:
        await asyncio.sleep(5)  # the coordinator has had every chance to plan again
        return await _events(state, job)

    after = asyncio.run(settle())
    duplicates = [e for e in after if isinstance(e.data, JobFailedV1)]
    assert len(duplicates) == len(failed) + 3  # the copies really reached the stream
    plans = [e for e in after if isinstance(e.data, ResumePlannedV2)]
    # One plan per failure: a duplicate may at most re-announce the same plan under the same
    # event id (JetStream drops it inside its duplicate window), never decide a second one.
    assert {e.id for e in plans} == {e.id for e in events if isinstance(e.data, ResumePlannedV2)}
    for_this_failure = {
        e.data.plan_id
        for e in plans
        if e.data.failed_run_id == failed[0].run_id and e.data.attempt == failed[0].attempt + 1
    }
    assert len(for_this_failure) == 1
    assert len(plans_before) >= 1
