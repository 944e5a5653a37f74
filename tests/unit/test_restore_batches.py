"""The coordinator's batch handlers for what running jobs report often (``job.progress``,
``job.heartbeat``: `CoordinatorHandlers.on_progress_batch`, `on_heartbeats`) leave the state,
the notes of life and the published events exactly as the one-event handlers do given the same
events in the same order: trajectories, last points, watches, a resumed attempt's continuity
verdict (published once), and the fencing of a stale attempt's reports. So does the batch
handler of failures (`on_failed_batch`)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.job import JobHeartbeatV1, JobProgressV1
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.restore_coordinator import domain
from ckpt_ha.restore_coordinator.app import compose_handlers
from ckpt_ha.restore_coordinator.handlers.decide import DecisionInProgress
from ckpt_ha.restore_coordinator.metrics import RestoreMetrics
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.pins import InMemoryPins
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.restores import InMemoryRestores
from tests.unit.test_restore_projection import JOB, RECORDS, T0, failed, memory, progress, started


class Coordinator:
    def __init__(self, tmp: Path) -> None:
        self.pins = InMemoryPins()
        self.state = InMemoryRestores(self.pins)
        self.bus = RecordingPublisher()
        registry = InMemoryRegistry()
        registry.put(*RECORDS)
        tmp.mkdir()
        self.handlers = compose_handlers(
            self.state, self.pins, registry, FsStore(tmp), self.bus,
            lambda: T0 + timedelta(hours=1), RestoreMetrics(ServiceMetrics("rc")),
            load_failed_grace_s=0.0,
        )  # fmt: skip

    async def one_by_one(self, events: list[Envelope[EventData]]) -> None:
        for event in events:
            handler = "on_progress" if isinstance(event.data, JobProgressV1) else "on_heartbeat"
            await getattr(self.handlers, handler)(event)

    async def batched(self, events: list[Envelope[EventData]]) -> None:
        """As the two consumers get them: each type's events in stream order, one batch."""
        reports = [e for e in events if isinstance(e.data, JobProgressV1)]
        beats = [e for e in events if isinstance(e.data, JobHeartbeatV1)]
        assert await self.handlers.on_progress_batch(reports) == [None] * len(reports)
        assert await self.handlers.on_heartbeats(beats) == [None] * len(beats)

    def seen(self) -> dict[str, Any]:
        published = [(e.event_type, e.data.model_dump_json()) for e in self.bus.events]
        return {**memory(self.state, self.pins), "heard": self.state.heard_at, "out": published}


class Events:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, *datas: EventData) -> list[Envelope[EventData]]:
        out = []
        for data in datas:
            self.n += 1
            out.append(
                build(data, source="t", time=T0 + timedelta(seconds=self.n), key=str(self.n))
            )
        return out


def beat(attempt: int, step: int) -> JobHeartbeatV1:
    return JobHeartbeatV1(
        job_id=JOB, run_id="run-1", attempt=attempt, sequence=step, last_step=step
    )


async def test_batches_leave_what_one_event_at_a_time_leaves(tmp_path: Path) -> None:
    ev = Events()
    start = ev(started(1))
    running = ev(
        *[progress(s) for s in (*range(195, 206), *range(295, 306))],
        beat(1, 305),
        progress(305),  # a step reported again
        beat(1, 306),
    )
    failure = ev(failed(1))
    one, many = Coordinator(tmp_path / "one"), Coordinator(tmp_path / "many")
    for c, feed in ((one, one.one_by_one), (many, many.batched)):
        await c.handlers.on_started(start[0])
        await feed(running)
        await c.handlers.on_failed(failure[0])  # plans from the trajectory the reports left
    [plan] = [e.data for e in one.bus.of_type("resume.planned")]
    restart = ev(started(2, plan.plan_id))
    resumed = ev(
        progress(306),  # the failed attempt, after its plan: fenced
        progress(301, 2, plan.plan_id),
        beat(2, 301),
        progress(302, 2, plan.plan_id),  # continuity_steps 2: the verdict
        progress(303, 2, plan.plan_id),  # after the verdict: trajectory
        beat(2, 303),
        progress(307),  # fenced again
    )
    for c, feed in ((one, one.one_by_one), (many, many.batched)):
        await c.handlers.on_started(restart[0])
        await feed(resumed)
    assert [e.event_type for e in one.bus.events][-1] == "resume.verified"
    assert many.seen() == one.seen()
    assert many.state.lasts[(JOB, 1)].step == 305  # the fenced reports moved nothing
    assert many.state.watches[JOB].last_step == 303


async def test_a_batch_moves_each_watch_once_to_its_newest_sign_of_life(tmp_path: Path) -> None:
    ev = Events()
    c = Coordinator(tmp_path / "c")
    await c.handlers.on_started(ev(started(1))[0])
    beats = ev(beat(1, 10), beat(1, 11), beat(1, 12))
    older = beats[0].model_copy(update={"time": T0})  # delivered late: never moves it back
    await c.handlers.on_heartbeats([*beats, older])
    watch = c.state.watches[JOB]
    assert (watch.seen, watch.last_step) == (beats[-1].time, 12)
    assert list(c.state.heard_at) == [f"{JOB}|run-1|1"]


async def test_a_batch_of_failures_decides_each_once_as_one_at_a_time(tmp_path: Path) -> None:
    """A burst (`on_failed_batch`): jobs decided concurrently, each job's failures in stream
    order, leave the state and the published decisions one-at-a-time handling leaves; a copy
    of a failure is decided once; a failure not ready yet fails alone."""
    other, unknown = "job-q", "job-r"

    def of(job: str, data: EventData) -> EventData:
        return data.model_copy(update={"job_id": job})

    ev = Events()
    starts = ev(started(1), of(other, started(1)))
    burst = ev(failed(1), of(other, failed(1)), of(unknown, failed(1)))
    copy = burst[0].model_copy(update={"id": "copy-of-the-first"})
    batch = [burst[0], burst[1], copy, burst[2]]
    one, many = Coordinator(tmp_path / "one"), Coordinator(tmp_path / "many")
    for c in (one, many):
        for s in starts:
            await c.handlers.on_started(s)
    results: list[BaseException | None] = []
    for event in batch:
        try:
            await one.handlers.on_failed(event)  # type: ignore[arg-type]
        except DependencyNotReady as exc:
            results.append(exc)
        else:
            results.append(None)
    got = await many.handlers.on_failed_batch(batch)
    assert [type(r) for r in got] == [type(r) for r in results]
    assert isinstance(got[3], DependencyNotReady)
    assert many.seen() == one.seen()
    kinds = sorted((e.event_type, e.data.job_id) for e in many.bus.events)
    assert kinds == [("resume.escalated", other), ("resume.planned", JOB)]


async def test_a_burst_keeps_each_failures_own_outcome_in_stream_order(tmp_path: Path) -> None:
    """One fetched batch holding a job's two failures (the second decided after the first's
    plan, in the next round), a held job's failure (recorded, not planned) and a failure
    another replica is deciding (its lease taken: that one waits alone) leaves what one at a
    time leaves, each failure with its own result."""
    held, leased = "job-q", "job-r"

    def of(job: str, data: EventData) -> EventData:
        return data.model_copy(update={"job_id": job})

    ev = Events()
    first_plan = domain.plan_id(JOB, "run-1", 1)
    starts = ev(started(1), started(2, first_plan), of(held, started(1)), of(leased, started(1)))
    batch = ev(failed(1), of(held, failed(1)), of(leased, failed(1)), failed(2, first_plan))
    one, many = Coordinator(tmp_path / "one"), Coordinator(tmp_path / "many")
    for c in (one, many):
        for s in starts:
            await c.handlers.on_started(s)
        await c.state.set_held(held, True)
        assert await c.state.lease(leased, 1, "another-replica", 30.0)
    results: list[type[BaseException] | None] = []
    for event in batch:
        try:
            await one.handlers.on_failed(event)  # type: ignore[arg-type]
        except DecisionInProgress as exc:
            results.append(type(exc))
        else:
            results.append(None)
    got = await many.handlers.on_failed_batch(batch)
    assert [type(r) if r is not None else None for r in got] == results
    assert results == [None, None, DecisionInProgress, None]
    assert many.seen() == one.seen()
    planned = [(e.data.job_id, e.data.attempt) for e in many.bus.of_type("resume.planned")]
    assert planned == [(JOB, 2), (JOB, 3)]  # in stream order, each once
    assert await many.state.failures(held) != []  # recorded
    assert many.state.leases[(leased, 1)][0] == "another-replica"  # never taken from it


async def test_each_failure_of_a_round_is_one_span_its_decision_traced_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With spans recorded: a round's failures each get one span (opened at its first step,
    entered again at the later ones, not opened anew), in the failure's own trace, and its
    decision is published in that trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", provider)
    other = "job-q"
    ev = Events()
    starts = ev(started(1), started(1).model_copy(update={"job_id": other}))
    batch = [
        e.model_copy(update={"traceparent": tracing.new_traceparent()})
        for e in ev(failed(1), failed(1).model_copy(update={"job_id": other}))
    ]
    many = Coordinator(tmp_path / "many")
    for s in starts:
        await many.handlers.on_started(s)
    assert await many.handlers.on_failed_batch(batch) == [None, None]
    spans = [s for s in exporter.get_finished_spans() if s.name.endswith("job.failed")]
    assert sorted(format(s.context.trace_id, "032x") for s in spans) == sorted(
        e.traceparent.split("-")[1] for e in batch if e.traceparent
    )
    for event in batch:
        [decision] = [e for e in many.bus.events if e.data.job_id == event.data.job_id]
        assert decision.traceparent is not None
        assert event.traceparent is not None
        assert tracing.same_trace(decision.traceparent, event.traceparent)
    provider.shutdown()
