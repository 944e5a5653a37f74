"""The batch pipeline of `Bus.batch_consumer`: batches are admitted as they are fetched, handled
one at a time in fetch order, and a stop leaves nothing half-handed-over (what was not handled
stays unsettled, so JetStream redelivers it) and no worker behind it."""

from __future__ import annotations

import asyncio
from typing import Any

from ckpt_ha.bus.batching import Admitted, BatchPipeline


class Recorder:
    """Admits a batch (its name in place of messages) and handles it when released."""

    def __init__(self) -> None:
        self.admitted: list[str] = []
        self.handled: list[str] = []
        self.heartbeats: dict[str, asyncio.Task[None]] = {}
        self.release = asyncio.Event()
        self.release.set()

    async def admit(self, raws: list[Any]) -> Admitted:
        [name] = raws
        self.admitted.append(name)
        self.heartbeats[name] = asyncio.create_task(asyncio.sleep(3600))
        return Admitted([name], [name], self.heartbeats[name])  # type: ignore[list-item]

    async def process(self, admitted: Admitted) -> None:
        await self.release.wait()
        self.handled.extend(admitted.events)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_batches_are_handled_one_at_a_time_in_fetch_order() -> None:
    r = Recorder()
    pipeline = BatchPipeline(r.admit, r.process)
    for name in ("a", "b", "c"):
        await pipeline.submit([name])
    await pipeline.drain(5.0)
    assert r.handled == ["a", "b", "c"]
    assert all(t.cancelled() for t in r.heartbeats.values())  # in-progress acks end with each


async def test_a_stop_leaves_what_was_not_handled_unsettled_and_no_worker_behind() -> None:
    r = Recorder()
    r.release.clear()  # the first batch's handling hangs
    pipeline = BatchPipeline(r.admit, r.process)
    await pipeline.submit(["a"])  # taken by the worker
    await settle()
    await pipeline.submit(["b"])  # waits in the queue
    blocked = asyncio.create_task(pipeline.submit(["c"]))  # waits for room in the queue
    await settle()
    assert r.admitted == ["a", "b", "c"]

    await pipeline.drain(0.1)  # "a" never finishes: cancelled at the drain's limit
    await blocked
    assert r.handled == []
    assert pipeline.worker is None
    assert pipeline.queue.empty()
    assert all(t.cancelled() for t in r.heartbeats.values())  # nothing held any more

    await pipeline.submit(["d"])  # fetched while faststream stops: not even admitted
    assert r.admitted == ["a", "b", "c"]
    assert pipeline.worker is None

    r.release.set()
    pipeline.reopen()  # the broker starts again
    await pipeline.submit(["e"])
    await pipeline.drain(5.0)
    assert r.handled == ["e"]


async def test_a_hand_over_cancelled_by_the_stop_ends_its_in_progress_acks() -> None:
    r = Recorder()
    r.release.clear()
    pipeline = BatchPipeline(r.admit, r.process)
    await pipeline.submit(["a"])
    await settle()
    await pipeline.submit(["b"])
    waiting = asyncio.create_task(pipeline.submit(["c"]))
    await settle()
    waiting.cancel()  # faststream cancels its consume task
    await asyncio.gather(waiting, return_exceptions=True)
    await settle()
    assert r.heartbeats["c"].cancelled()
    r.release.set()
    await pipeline.drain(5.0)
    assert r.handled == ["a", "b"]
