"""Steps the faults share: start a writer and wait for checkpoints in flight, end with the
figures.

Waiting uses `tests.support.bus_tools.wait_for` (poll with a deadline). The only sleeps are
the faults' own durations (how long a service stays dead, storage stays cut).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.devstack import stack
from ckpt_ha.registry.redis_registry import Registry
from tests.faults.stack import FaultStack
from tests.faults.tally import NON_FINAL, Figures, converge
from tests.faults.writer import CheckpointWriter, Save
from tests.support.bus_tools import wait_for

CONVERGE_BOUND_S = 150.0
"""How long a fault may take to converge after it ended: proves "converges", not a speed."""


def job_for(fault: str) -> str:
    return f"f-{fault}-{uuid.uuid4().hex[:6]}"


async def valid_at_least(registry: Registry, job: str, n: int, timeout: float = 60) -> None:
    async def enough() -> bool:
        return len(await registry.by_job(job, state=S.VALID)) >= n

    await wait_for(enough, timeout=timeout, what=f"{n} valid checkpoints of {job}")


async def in_flight(registry: Registry, job: str, timeout: float = 15) -> bool:
    """Wait for a checkpoint of ``job`` that is not final yet (being written or verified);
    False if none showed up in time (the fault then hits between two checkpoints)."""

    async def found() -> bool:
        return any(r.state in NON_FINAL for r in await registry.by_job(job))

    try:
        await wait_for(found, timeout=timeout, what="a checkpoint in flight")
    except AssertionError:
        return False
    return True


async def stop_writer(writer: CheckpointWriter) -> list[Save]:
    return await asyncio.to_thread(writer.stop)


async def settle(
    fs: FaultStack,
    registry: Registry,
    name: str,
    jobs: Sequence[str],
    saves: Sequence[Save],
    *,
    ended: float,
    good: frozenset[S] = frozenset({S.VALID}),
    bound_s: float = CONVERGE_BOUND_S,
) -> Figures:
    """The figures once the system converged after a fault that ended at ``ended``."""
    return await converge(
        name,
        registry,
        fs.direct_store(),
        stack.bus_config(fs.state()),
        jobs,
        saves,
        since=ended,
        bound_s=bound_s,
        good=good,
    )


def now() -> float:
    return time.monotonic()
