"""The fault suite: real writers against the five real service processes, one fault at a time.

Each test starts a job writing checkpoints, injects its fault, waits for the system to converge
and records ``FAULT <name>: written=N valid=N lost=0 doubled=0 stuck=0 converge_s=T.T``
(see `tests.faults.tally` for what is counted). They share one stack (`conftest.fault_stack`)
and run in this file's order; the stream purge comes last, as it re-creates the event stream.
"""

from __future__ import annotations

import asyncio

import pytest

from ckpt_ha.registry.redis_registry import Registry
from tests.faults.book import FigureBook
from tests.faults.flows import in_flight, job_for, now, settle, stop_writer, valid_at_least
from tests.faults.stack import FaultStack
from tests.faults.writer import CheckpointWriter

pytestmark = pytest.mark.faults

DOWN_S = 4.0
"""How long a killed service stays dead while the writer goes on."""


async def kill_mid_flow(
    fs: FaultStack, registry: Registry, figures: FigureBook, name: str, *services: str
) -> None:
    job = job_for(name)
    writer = CheckpointWriter(fs, job).start()
    try:
        await valid_at_least(registry, job, 2)
        await in_flight(registry, job)
        fs.kill(*services)
        await asyncio.sleep(DOWN_S)
        fs.up()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    figures.record(await settle(fs, registry, name, [job], saves, ended=ended))


@pytest.mark.timeout(240)
async def test_sigkill_writer_watcher(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    await kill_mid_flow(fault_stack, registry, figures, "sigkill-writer-watcher", "writer-watcher")
