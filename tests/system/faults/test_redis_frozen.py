"""A fault of the suite (`test_faults.py`) on a stack of its own (`conftest.fault_stack`, one per
file): Redis frozen for two minutes. Alone in its file so that it runs beside the others."""

from __future__ import annotations

import asyncio

import pytest

from ckpt_ha.registry.redis_registry import Registry
from tests.system.faults.book import FigureBook
from tests.system.faults.flows import (
    announce_start,
    dead_letters,
    in_flight,
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

REDIS_FROZEN_S = 120.0


@pytest.mark.timeout(420)
async def test_redis_frozen_for_two_minutes(
    fault_stack: FaultStack, registry: Registry, figures: FigureBook
) -> None:
    """redis-server stopped with SIGSTOP for 2 minutes (it keeps its sockets and answers
    nothing), then SIGCONT, while the writer goes on: no handler may hold its message for good,
    and every checkpoint written meanwhile must end valid."""
    fs, name = fault_stack, "redis-sigstop-120s"
    job = job_for(name)
    letters = await dead_letters(fs)
    await announce_start(fs, job)
    writer = CheckpointWriter(fs, job, every_s=1.0).start()
    try:
        await valid_at_least(registry, job, 2)
        mid_flow = await in_flight(registry, job)
        fs.pause_redis()
        try:
            await asyncio.sleep(REDIS_FROZEN_S)
        finally:
            fs.resume_redis()
    finally:
        saves = await stop_writer(writer)
    ended = now()
    result = await settle(fs, registry, name, [job], saves, ended=ended, letters_before=letters)
    result.evidence["frozen_mid_flow"] = mid_flow
    await tier_recorded(registry, job, "standard", result)
    figures.record(result)
