"""A fault of the suite (`test_faults.py`) on a stack of its own (`conftest.fault_stack`, one per
file): nats-server down for three minutes. Alone in its file so that it runs beside the others."""

from __future__ import annotations

import asyncio

import pytest

from ckpt_ha.registry.redis_registry import Registry
from tests.system.faults.book import FigureBook
from tests.system.faults.flows import (
    announce_start,
    dead_letters,
    job_for,
    now,
    settle,
    stop_writer,
    tier_recorded,
    valid_at_least,
)
from tests.system.faults.stack import FaultStack
from tests.system.faults.writer import CheckpointWriter

pytestmark = pytest.mark.faults

NATS_OUTAGE_S = 180.0


@pytest.mark.timeout(480)
async def test_nats_outage_of_three_minutes(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """nats-server stopped for 3 minutes, then started on its port: longer than any client
    library's default reconnect budget. The services must reconnect by themselves (no restart)
    and announce what was written meanwhile."""
    fs, name = fault_stack, "nats-outage-180s"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    pids = {p.name: p.pid for p in fs.state().processes}
    writer = CheckpointWriter(fs, job, every_s=2.0).start()
    try:
        await valid_at_least(registry, job, 2)
        fs.stop_nats()
        await asyncio.sleep(NATS_OUTAGE_S)
        fs.start_nats()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    await tier_recorded(registry, job, "standard", result)
    result.evidence["healthy_after"] = fs.healthy()
    figures.record(result)
    assert {p.name: p.pid for p in fs.state().processes} == pids, "a service was restarted"
    assert all(result.evidence["healthy_after"].values()), result.evidence["healthy_after"]
