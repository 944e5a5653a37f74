"""Steps the faults share: start a writer and wait for checkpoints in flight, end with the
figures.

Waiting uses `tests.support.bus_tools.wait_for` (poll with a deadline). The only sleeps are
the faults' own durations (how long a service stays dead, storage stays cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import nats
from nats.aio.msg import Msg

from ckpt_ha.bus.broker import Bus
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointWritingV1,
    RuntimeEnvironment,
)
from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.contracts.resume import ResumePlannedV1
from ckpt_ha.core.clock import Clock
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor import app as janitor_app
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.store import RedisResumes
from ckpt_ha.runtime import local_stack
from ckpt_ha.storage import ObjectStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.bus_tools import stream_messages, wait_for
from tests.support.janitor import KEEP_S
from tests.system.faults.stack import FaultStack
from tests.system.faults.tally import NON_FINAL, Figures, converge
from tests.system.faults.writer import CheckpointWriter, Save

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


async def announce_start(
    fs: FaultStack,
    job: str,
    tier: str = "standard",
    environment: RuntimeEnvironment | None = None,
) -> None:
    """``job.started`` for ``job``, declaring ``tier``, as its runner publishes it;
    ``environment``: the one its checkpoints record, for a failure of it to be restorable
    (R14)."""
    bus = Bus(local_stack.bus_config(fs.state()), "fault-runner")
    await bus.broker.start()
    try:
        data = JobStartedV1(
            job_id=job, run_id="run-1", attempt=1, tier=tier, environment=environment
        )
        await bus.publish(build(data, source="ckpt-ha/runner", time=datetime.now(UTC), key=job))
    finally:
        await bus.broker.stop()


@dataclass(frozen=True)
class BusState:
    dead_letters: int
    busy_consumers: dict[str, dict[str, int]]
    """Consumers with messages pending or unacknowledged."""


async def dead_letters(fs: FaultStack) -> int:
    return (await bus_state(fs)).dead_letters


async def bus_state(fs: FaultStack) -> BusState:
    """Every consumer's pending and unacknowledged messages, and the dead letters: evidence of a
    consumer that stalled or gave up."""
    nc = await nats.connect(fs.nats_url, connect_timeout=5, max_reconnect_attempts=1)
    try:
        js = nc.jetstream()
        cfg = local_stack.bus_config(fs.state())
        consumers = {
            c.name: {"pending": c.num_pending or 0, "unacked": c.num_ack_pending or 0}
            for c in await js.consumers_info(cfg.events_stream)
        }
        letters = (await js.stream_info(cfg.dead_letter_stream)).state.messages
    finally:
        await nc.close()
    busy = {
        name: c
        for name, c in consumers.items()
        if "--" in name and (c["pending"] or c["unacked"])  # the services' durables
    }
    return BusState(letters, busy)


async def idle(fs: FaultStack) -> bool:
    """Every service's consumer has taken and acknowledged everything (False while NATS is
    unreachable)."""
    try:
        return not (await bus_state(fs)).busy_consumers
    except (OSError, nats.errors.Error):
        return False


async def quiet(fs: FaultStack, timeout: float = 60) -> None:
    await wait_for(lambda: idle(fs), timeout=timeout, what="every consumer idle")


async def settle(
    fs: FaultStack,
    registry: Registry,
    name: str,
    jobs: Sequence[str],
    saves: Sequence[Save],
    *,
    ended: float,
    want: Mapping[str, frozenset[S]] | None = None,
    bound_s: float = CONVERGE_BOUND_S,
    letters_before: int = 0,
) -> Figures:
    """The figures once the system converged after a fault that ended at ``ended``;
    ``letters_before``: the dead letters before the fault (`dead_letters`)."""
    figures = await converge(
        name,
        registry,
        fs.direct_store(),
        local_stack.bus_config(fs.state()),
        jobs,
        saves,
        since=ended,
        bound_s=bound_s,
        want=want,
        idle=lambda: idle(fs),
    )
    after = await bus_state(fs)
    figures.evidence["new_dead_letters"] = after.dead_letters - letters_before
    figures.evidence["busy_consumers"] = after.busy_consumers
    return figures


def now() -> float:
    return time.monotonic()


async def tier_recorded(registry: Registry, job: str, tier: str, figures: Figures) -> None:
    """A ``job.started`` whose declared tier the registry never recorded is a lost event."""
    found = await registry.tier_of(job)
    figures.evidence["tier"] = f"{found.tier.name} ({found.source})"
    if found.tier.name != tier:
        figures.lose(f"{job}: declared tier {tier} not recorded ({found.detail})")


def saves_of(fs: FaultStack, events: Sequence[Envelope[EventData]]) -> list[Save]:
    """The saves of a training job, from its own announcements: every checkpoint it announced
    ``committed``, and every one it announced ``writing`` and never committed (killed mid-write)."""
    writing: dict[str, Envelope[EventData]] = {}
    committed: dict[str, Envelope[EventData]] = {}
    for e in events:
        cid = str(e.data.__dict__.get("checkpoint_id", ""))
        if isinstance(e.data, CheckpointWritingV1):
            writing.setdefault(cid, e)
        elif isinstance(e.data, CheckpointCommittedV1):
            committed.setdefault(cid, e)
    out = []
    for cid, e in {**writing, **committed}.items():
        uri = str(e.data.__dict__["uri"])
        folder = uri.removeprefix(fs.root + "/")
        step = int(e.data.__dict__.get("step") or 0)
        if cid in committed:
            out.append(Save(step, folder, uri, cid))
        else:
            out.append(Save(step, folder, uri, cid, error="never committed (killed mid-write)"))
    return out


def plans_per_failure(events: Sequence[Envelope[EventData]]) -> list[str]:
    """Failures planned more than once: one ``resume.planned`` per attempt (and per fallback)."""
    plans = {e.id: e.data for e in events if isinstance(e.data, ResumePlannedV1)}
    per_failure = Counter((p.attempt, p.fallback_from) for p in plans.values())
    return [
        f"attempt {a} (fallback from {f}): {n} plans" for (a, f), n in per_failure.items() if n > 1
    ]


class ShiftedClock:
    """Real time plus an offset the fault moves forward (past a tier's ages and grace)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@contextlib.asynccontextmanager
async def janitor_rounds(
    bus_config: BusConfig, redis_url: str, prefix: str, store: ObjectStore, clock: Clock
) -> AsyncIterator[Janitor]:
    """The retention-janitor's rounds (`Janitor`, composed as its app does) on ``clock``, which
    the caller moves days ahead so retention expires and deletes within a test's time. No
    consumers: the rounds run only when the caller runs them, on the view of resumes the stack's
    janitor service keeps (and wait, as its rounds do, until that view has caught up)."""
    bus = Bus(bus_config, "retention-janitor")
    await bus.broker.start()
    client = connect(redis_url)
    try:
        yield Janitor(
            Registry(client, prefix),
            RedisResumes(client, prefix, KEEP_S),
            janitor_app.feed(bus),
            store,
            bus,
            clock,
            RetentionMetrics(ServiceMetrics("retention-janitor")),
        )
    finally:
        await bus.broker.stop()
        await client.aclose()


@contextlib.asynccontextmanager
async def janitor_ahead(fs: FaultStack, clock: ShiftedClock) -> AsyncIterator[Janitor]:
    """`janitor_rounds` on the fault stack, storage through the services' link."""
    config = local_stack.bus_config(fs.state())
    async with janitor_rounds(config, fs.redis_url, "ckpt-ha", fs.services_store(), clock) as j:
        yield j


@contextlib.asynccontextmanager
async def capture_stream(
    fs: FaultStack, prefix: str
) -> AsyncIterator[Callable[[], Awaitable[list[Msg]]]]:
    """A stream holding whatever is published under ``<prefix>.ev.>`` (announcements kept
    back, to be delivered later in another order); yields a reader of what it holds."""
    name = f"FAULT_CAPTURE_{prefix.upper()}"
    nc = await nats.connect(fs.nats_url)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{prefix}.ev.>"])

    async def held() -> list[Msg]:
        return await stream_messages(fs.nats_url, name)

    try:
        yield held
    finally:
        await js.delete_stream(name)
        await nc.close()
