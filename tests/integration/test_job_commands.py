"""`ckpt-ha job ...` against real NATS and Redis, with the real registrar and restore-coordinator
in-process: a job's timeline (list, show), hold → a failure recorded, not planned → unhold →
planned, and a chosen rollback planned for the checkpoint asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.runtime.settings import ServiceSettings
from tests.integration import test_restore_coordinator as rc
from tests.support.cli_tools import cli

pytestmark = pytest.mark.integration

# The coordinator's fixtures (one storage root for the registrar and the coordinator).
settings, coord_settings, coordinator = rc.settings, rc.coord_settings, rc.coordinator
failed, started, waiter, three_checkpoints = rc.failed, rc.started, rc.waiter, rc.three_checkpoints


async def test_list_and_show_tell_a_jobs_story(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    job = "job-story"
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job))
    await producer.publish(failed(job))
    [plan] = await waiter(settings)("resume.planned", job)

    rc, out, err = await cli(settings, tmp_path, "job", "list", "--json")
    assert rc == 0, err
    [row] = [r for r in json.loads(out) if r["job_id"] == job]
    assert (row["state"], row["attempt"], row["failures"], row["held"]) == (
        "restoring",
        1,
        1,
        False,
    )

    rc, out, err = await cli(settings, tmp_path, "job", "show", job, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["newest_valid"]["checkpoint_id"] == f"{job}-c3"
    assert {p["checkpoint_id"] for p in doc["pins"]} == {f"{job}-c3", f"{job}-c2"}
    kinds = [e["kind"] for e in doc["timeline"]]
    assert kinds == ["started", "failed", "planned"]
    assert "node_exit" in doc["timeline"][1]["summary"]
    assert doc["timeline"][2]["plan_id"] == plan["plan_id"]

    rc, out, err = await cli(settings, tmp_path, "job", "show", job)
    assert rc == 0, err
    assert f"newest valid checkpoint: {job}-c3 (step 300)" in out
    assert f"to restore {job}-c3 at step 300" in out

    rc, out, err = await cli(settings, tmp_path, "job", "show", "no-such-job")
    assert rc == 1
    assert err.strip() == "ckpt-ha: no job 'no-such-job': no event and no checkpoint of it"
