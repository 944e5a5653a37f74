"""The fault suite: real writers against the five real service processes, one fault at a time.

Each test starts a job writing checkpoints, injects its fault, waits for the system to converge
and records ``FAULT <name>: written=N valid=N lost=0 doubled=0 stuck=0 converge_s=T.T``
(see `tests.faults.tally` for what is counted). They share one stack (`conftest.fault_stack`)
and run in this file's order; the stream purge comes last, as it re-creates the event stream.
"""

from __future__ import annotations

import asyncio

import pytest

from ckpt_ha.drill.assess import assess_restore
from ckpt_ha.drill.harness import Drill, policy, progress_at_least, resumed_after, valid_count
from ckpt_ha.registry.redis_registry import Registry
from tests.faults.book import FigureBook
from tests.faults.flows import (
    announce_start,
    dead_letters,
    in_flight,
    job_for,
    now,
    plans_per_failure,
    saves_of,
    settle,
    stop_writer,
    tier_recorded,
    valid_at_least,
)
from tests.faults.stack import FaultStack
from tests.faults.writer import CheckpointWriter

pytestmark = pytest.mark.faults

DOWN_S = 4.0
"""How long a killed service stays dead while the writer goes on."""


TRAINING = ["--steps", "60", "--checkpoint-every", "10", "--sleep-per-step", "0.05"]
"""The drills' example job (numpy MLP), short: a checkpoint every 10 steps."""


async def kill_mid_flow(
    fs: FaultStack,
    registry: Registry,
    figures: FigureBook,
    name: str,
    *services: str,
    start_while_down: bool = False,
) -> None:
    """SIGKILL ``services`` while the writer's checkpoints are in flight, leave them dead for
    `DOWN_S` while it writes on, start them again (`up`). The job's start (declaring its tier)
    is published before the kill, or while the services are dead."""
    job = job_for(name)
    letters = await dead_letters(fs)
    if not start_while_down:
        await announce_start(fs, job)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 2)
        mid_flow = await in_flight(registry, job)
        fs.kill(*services)
        if start_while_down:
            await announce_start(fs, job)
        await asyncio.sleep(DOWN_S)
        fs.up()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    result.evidence["killed_mid_flow"] = mid_flow
    await tier_recorded(registry, job, "standard", result)
    figures.record(result)


@pytest.mark.timeout(240)
async def test_sigkill_writer_watcher(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(fault_stack, registry, figures, "sigkill-writer-watcher", "writer-watcher")


@pytest.mark.timeout(240)
async def test_sigkill_integrity_checker(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(
        fault_stack, registry, figures, "sigkill-integrity-checker", "integrity-checker"
    )


@pytest.mark.timeout(240)
async def test_sigkill_registrar(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(fault_stack, registry, figures, "sigkill-registrar", "registrar")


@pytest.mark.timeout(240)
async def test_sigkill_retention_janitor(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """The job's start (its declared tier) is published while the janitor is dead."""
    await kill_mid_flow(
        fault_stack, registry, figures, "sigkill-retention-janitor", "retention-janitor",
        start_while_down=True,
    )  # fmt: skip


@pytest.mark.timeout(300)
async def test_sigkill_restore_coordinator(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """A training job under `ckpt-ha run` dies while the coordinator is dead: the failure waits
    on the stream, and is planned once when the coordinator is back; the job resumes from its
    last valid checkpoint, exactly, and finishes."""
    fs, name = fault_stack, "sigkill-restore-coordinator"
    job = job_for(name)
    drill = Drill(fs.home, fs.state(), job, budget_s=240, log=print, scenario=name)
    letters = await dead_letters(fs)
    try:
        drill.launch(policy(), TRAINING, fs.writer_env())
        valid = await drill.until(lambda: valid_count(drill, registry, 2), "two valid checkpoints")
        newest = max(r.step or 0 for r in valid)
        await drill.until(lambda: progress_at_least(drill, newest + 3), "training to go on")
        fs.kill("restore-coordinator")
        fault = await drill.kill_training()
        await asyncio.sleep(DOWN_S)
        fs.up()
        ended = now()
        await drill.until(lambda: resumed_after(drill, fault), "the resume verdict")
        code = await drill.wait_exit()
    finally:
        drill.stop()
    events = await drill.events()
    result = await settle(
        fs, registry, name, [job], saves_of(fs, events), ended=ended, letters_before=letters
    )
    for why in plans_per_failure(events):
        result.double(why)
    restore = assess_restore(name, events, job, fault)
    result.evidence["restore"] = {"verdict": restore.verdict, "reasons": restore.reasons}
    figures.record(result)
    assert code == 0, drill.runner_log
    assert restore.verdict == "pass", restore.reasons


@pytest.mark.timeout(240)
async def test_sigkill_registrar_and_integrity_checker(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(
        fault_stack, registry, figures, "sigkill-registrar+integrity-checker",
        "registrar", "integrity-checker",
    )  # fmt: skip
