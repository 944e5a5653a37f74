"""`ckpt-ha job ...` against real NATS and Redis, with the real registrar and restore-coordinator
in-process: a job's timeline (list, show), hold → a failure recorded, not planned → unhold →
planned, and a chosen rollback planned for the checkpoint asked for."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.cli.jobs import _indexed
from ckpt_ha.contracts import CATALOG
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.contracts.subjects import job_token
from ckpt_ha.ops import jobs
from ckpt_ha.registrar.app import Registrar
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator.app import RestoreCoordinator
from ckpt_ha.runtime.settings import ServiceSettings
from tests.integration import test_restore_coordinator as coord_tests
from tests.support.bus_tools import wait_for
from tests.support.cli_tools import cli

pytestmark = pytest.mark.integration

# The coordinator's fixtures (one storage root for the registrar and the coordinator).
settings, coord_settings, coordinator = (
    coord_tests.settings,
    coord_tests.coord_settings,
    coord_tests.coordinator,
)
failed, started, waiter, three_checkpoints = (
    coord_tests.failed,
    coord_tests.started,
    coord_tests.waiter,
    coord_tests.three_checkpoints,
)
settled = coord_tests.settled
progress = coord_tests.progress


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


async def test_hold_records_a_failure_unhold_plans_it(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    job = "job-held"
    await three_checkpoints(registrar, producer, job)
    await producer.publish(started(job))
    rc_, out, err = await cli(settings, tmp_path, "job", "hold", job, "--actor", "alice",
                             "--reason", "storage maintenance", "--json")  # fmt: skip
    assert rc_ == 0, err
    assert json.loads(out)["event"] == "job.held"
    await settled(settings, "held")
    await producer.publish(failed(job))
    await settled(settings, "failed")
    assert await coord_tests.wait_none(settings, job) == []
    rc_, out, err = await cli(settings, tmp_path, "job", "show", job, "--json")
    assert rc_ == 0, err
    doc = json.loads(out)
    assert (doc["held"], [e["kind"] for e in doc["timeline"]]) == (
        True,
        ["started", "held", "failed"],
    )
    assert "by alice: storage maintenance" in doc["timeline"][1]["summary"]

    rc_, _, err = await cli(settings, tmp_path, "job", "unhold", job, "--actor", "alice")
    assert rc_ == 0, err
    [plan] = await waiter(settings)("resume.planned", job)
    assert plan["checkpoint_id"] == f"{job}-c3"


async def test_restore_to_plans_the_chosen_checkpoint_and_refuses_others(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
    tmp_path: Path,
) -> None:
    job = "job-rollback"
    await three_checkpoints(registrar, producer, job)
    await coord_tests.make_valid(registrar, producer, "job-other", "job-other-c1", 100)
    await producer.publish(started(job))
    rc_, _, err = await cli(settings, tmp_path, "job", "hold", job, "--actor", "bob")
    assert rc_ == 0, err
    await settled(settings, "held")
    await producer.publish(failed(job))
    await settled(settings, "failed")

    rc_, _, err = await cli(settings, tmp_path, "job", "restore", job, "--to", "job-other-c1",
                            "--actor", "bob")  # fmt: skip
    assert rc_ == 4  # refused
    assert err.strip() == (f"ckpt-ha: checkpoint job-other-c1 belongs to job job-other, not {job}")
    rc_, out, err = await cli(settings, tmp_path, "job", "restore", job, "--to", f"{job}-c1",
                              "--actor", "bob", "--reason", "loss spike")  # fmt: skip
    assert rc_ == 0, err
    assert f"job.restore_requested recorded for job {job} by bob" in out
    [plan] = await waiter(settings)("resume.planned", job)
    assert (plan["checkpoint_id"], plan["mode"]) == (f"{job}-c1", "exact_resume")
    for ckpt in (f"{job}-c2", f"{job}-c3"):
        record = await registrar.registry.get(ckpt)
        assert record is not None
        assert record.state is CheckpointState.VALID


async def test_the_index_answers_what_the_whole_stream_says(
    coordinator: RestoreCoordinator,
    registrar: Registrar,
    producer: Bus,
    settings: ServiceSettings,
) -> None:
    """`job list` and `job show` from the job index equal the same reports computed from the
    whole of both streams, as they were before the index (issue 33)."""
    for job in ("job-a", "job-b"):
        await three_checkpoints(registrar, producer, job)
        await producer.publish(started(job))
    await producer.publish(progress("job-a", 250))
    await producer.publish(failed("job-a"))
    await waiter(settings)("resume.planned", "job-a")
    cfg = settings.bus()

    async def scanned() -> list[object]:
        everything, _ = await read_events(cfg, CATALOG, f"{cfg.prefix}.ev.>", idle_timeout=2.0)
        return [s.to_json() for s in jobs.summaries(everything)]

    async def indexed() -> list[object]:
        return [s.to_json() for s in jobs.summaries(await _indexed(settings))]

    expected = await scanned()
    assert {"job-a", "job-b"} <= {row["job_id"] for row in expected}  # type: ignore[index]
    # The index's consumers run beside the test: equal once they have applied it all.
    await wait_for(lambda: _equal(indexed, expected), timeout=15, what="the index caught up")
    registry = Registry.from_url(settings.redis_url, settings.registry_prefix)
    try:
        for job in ("job-a", "job-b"):
            shown: list[tuple[object, object]] = []  # (index, stream): the last read of each
            try:
                await wait_for(
                    lambda job=job, shown=shown: _shown_alike(settings, registry, job, shown),  # type: ignore[misc]
                    timeout=15,
                    what=f"job show {job} from the index",
                )
            except AssertionError:
                assert shown[-1][0] == shown[-1][1]  # shows where the two part
                raise
    finally:
        await registry.close()


async def _shown_alike(
    settings: ServiceSettings, registry: Registry, job: str, shown: list[tuple[object, object]]
) -> bool:
    """`job show` from the index and from the job's events on the stream, both read again (the
    registrar may still be announcing a verification)."""
    cfg = settings.bus()
    own, _ = await read_events(
        cfg, CATALOG, f"{cfg.prefix}.ev.*.*.*.{job_token(job)}", idle_timeout=2.0
    )
    records = await registry.by_job(job)
    before = jobs.show(job, own, records)
    after = jobs.show(job, await _indexed(settings, [job]), records)
    assert before is not None
    assert after is not None
    shown.append((after.to_json(), before.to_json()))
    return shown[-1][0] == shown[-1][1]


async def _equal(read: Callable[[], Awaitable[list[object]]], expected: list[object]) -> bool:
    return await read() == expected
