"""job.failed → resume.planned latency of the restore-coordinator with a large registry.

Fills Redis (a private prefix) with ``--jobs`` times ``--per-job`` checkpoint records written
directly in the registry's key layout (the newest of each job still pending verification, the
rest valid), starts the real coordinator in-process on private NATS streams, announces
``job.started`` for ``--failures`` jobs, then publishes one ``job.failed`` at a time and times
it until its ``resume.planned`` arrives on a plain NATS subscription. Prints p50/p90/p99/max,
then a burst (all failures of a second attempt published at once) for throughput. Cleans its
Redis keys and streams afterwards. Usage:
    .venv/bin/python bench/bench_plan.py [--jobs 10000] [--per-job 100] [--failures 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import nats
import redis.asyncio as aioredis
from nats.aio.msg import Msg

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointFormat,
    CheckpointIdentity,
    CheckpointState,
    RuntimeEnvironment,
    Topology,
)
from ckpt_ha.contracts.job import JobFailedV1, JobPolicy, JobStartedV1
from ckpt_ha.core.records import CheckpointRecord, HistoryEntry
from ckpt_ha.registry.keys import RegistryKeys
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings

ENV = RuntimeEnvironment(
    framework="torch", framework_version="2.3.0", python_version="3.11.9", image="trainer:1"
)
TOPO = Topology(world_size=8, tensor_parallel=2)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def job_name(j: int) -> str:
    return f"bench-job-{j:05d}"


def template() -> dict[str, object]:
    """One realistic registry record (identity, checksums, three history entries) as JSON."""
    record = CheckpointRecord(
        checkpoint_id="X",
        job_id="J",
        run_id="run-1",
        step=0,
        uri="file:///bench/J/step-0",
        format=CheckpointFormat.NATIVE,
        state=CheckpointState.VALID,
        identity=CheckpointIdentity(
            job_id="J",
            run_id="run-1",
            environment=ENV,
            topology=TOPO,
            code_version="abc",
            created_at=T0,
        ),
        shard_count=8,
        total_bytes=1 << 30,
        exact_resume=True,
        checksums={f"shard-{i}.bin": "xxh3_64:0123456789abcdef" for i in range(8)},
        created_at=T0,
        updated_at=T0,
        history=tuple(
            HistoryEntry(
                state=s, at=T0, event_id=str(uuid.uuid4()), event_type=f"checkpoint.{e}", actor="b"
            )
            for s, e in (
                (CheckpointState.WRITING, "writing"),
                (CheckpointState.PENDING_VERIFICATION, "committed"),
                (CheckpointState.VALID, "verified"),
            )
        ),
    )
    doc: dict[str, object] = json.loads(record.model_dump_json())
    return doc


async def fill(r: aioredis.Redis, prefix: str, jobs: int, per_job: int) -> None:
    doc = template()
    identity = doc["identity"]
    assert isinstance(identity, dict)
    valid: list[str] = []
    pending: list[str] = []
    keys = RegistryKeys(prefix)
    async with r.pipeline(transaction=False) as pipe:
        for j in range(jobs):
            job = job_name(j)
            identity["job_id"] = job
            records: dict[str, str] = {}
            steps: dict[str, int] = {}
            for s in range(per_job):
                step = (s + 1) * 100
                cid = f"{job}-s{step}"
                newest = s == per_job - 1
                doc.update(
                    checkpoint_id=cid,
                    job_id=job,
                    step=step,
                    uri=f"file:///bench/{job}/step-{step}",
                    state="pending_verification" if newest else "valid",
                )
                records[keys.checkpoint(cid)] = json.dumps(doc, separators=(",", ":"))
                steps[cid] = step
                (pending if newest else valid).append(cid)
            pipe.mset(records)
            pipe.zadd(keys.job(job), steps)
            if len(pipe) >= 200:
                await pipe.execute()
        pipe.sadd(keys.jobs, *[job_name(j) for j in range(jobs)])
        for i in range(0, len(valid), 10_000):
            pipe.sadd(keys.state("valid"), *valid[i : i + 10_000])
        for i in range(0, len(pending), 10_000):
            pipe.sadd(keys.state("pending_verification"), *pending[i : i + 10_000])
        await pipe.execute()


async def clean(r: aioredis.Redis, prefix: str) -> int:
    n = 0
    batch: list[str] = []
    async for key in r.scan_iter(match=f"{prefix}:*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            n += await r.unlink(*batch)
            batch.clear()
    if batch:
        n += await r.unlink(*batch)
    return n


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def announce(
    producer: Bus, nc: nats.NATS, stream: str, jobs: list[str], attempt: int, now: datetime
) -> None:
    """``job.started`` for every job, and wait until the coordinator recorded them all."""
    for job in jobs:
        await producer.publish(
            build(
                JobStartedV1(
                    job_id=job,
                    run_id="run-1",
                    attempt=attempt,
                    policy=JobPolicy(max_restarts=5),
                    environment=ENV,
                    topology=TOPO,
                    code_version="abc",
                ),
                source="bench",
                time=now,
                key=f"s{attempt}",
            )
        )
    while True:
        info = await nc.jetstream().consumer_info(stream, "restore-coordinator--started")
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.1)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--per-job", type=int, default=100)
    ap.add_argument("--failures", type=int, default=1_000)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = ap.parse_args()
    tag = uuid.uuid4().hex[:8]
    settings = RestoreCoordinatorSettings(
        NATS_URL=args.nats,
        REDIS_URL=args.redis,
        subject_prefix=f"bench{tag}",
        events_stream=f"BENCH_EV_{tag}",
        dead_letter_stream=f"BENCH_DLQ_{tag}",
        progress_stream=f"BENCH_PR_{tag}",
        registry_prefix=f"bench-plan:{tag}",
        storage_root="/tmp/ckpt-ha-bench-plan",
    )
    r = aioredis.Redis.from_url(args.redis, decode_responses=True)
    nc = await nats.connect(args.nats)
    coordinator = build_coordinator(settings)
    producer = Bus(settings.bus(), "bench-runner")
    try:
        start = time.perf_counter()
        await fill(r, settings.registry_prefix, args.jobs, args.per_job)
        total = args.jobs * args.per_job
        print(
            f"filled {total:,} checkpoints across {args.jobs:,} jobs "
            f"in {time.perf_counter() - start:.1f}s "
            f"(redis used_memory {(await r.info('memory'))['used_memory_human']})"
        )
        await coordinator.bus.broker.start()
        await producer.broker.start()
        failing = [job_name(j) for j in range(0, args.jobs, max(1, args.jobs // args.failures))]
        failing = failing[: args.failures]
        now = datetime.now(UTC)
        await announce(producer, nc, settings.events_stream, failing, 1, now)

        arrived: dict[tuple[str, int], asyncio.Future[float]] = {}

        async def on_plan(msg: Msg) -> None:
            doc = json.loads(msg.data)
            fut = arrived.get((doc["data"]["job_id"], doc["data"]["attempt"] - 1))
            if fut is not None and not fut.done():
                fut.set_result(time.perf_counter())

        await nc.subscribe(f"{settings.subject_prefix}.ev.resume.planned.*.*", cb=on_plan)
        await nc.subscribe(f"{settings.subject_prefix}.ev.resume.escalated.*.*", cb=on_plan)
        loop = asyncio.get_running_loop()

        def failure(job: str, attempt: int) -> Envelope[EventData]:
            return build(
                JobFailedV1(job_id=job, run_id="run-1", attempt=attempt, last_step=9_950),
                source="bench",
                time=now + timedelta(seconds=attempt),
                key=f"f{attempt}",
            )

        latencies: list[float] = []
        for job in failing:
            fut = arrived[(job, 1)] = loop.create_future()
            t0 = time.perf_counter()
            await producer.publish(failure(job, 1))
            latencies.append((await asyncio.wait_for(fut, 10) - t0) * 1000)
        ms = [round(x, 2) for x in (pct(latencies, q) for q in (0.5, 0.9, 0.99))]
        print(
            f"job.failed -> resume.planned, one at a time, {len(latencies)} failures: "
            f"p50 {ms[0]} ms, p90 {ms[1]} ms, p99 {ms[2]} ms, max {max(latencies):.2f} ms, "
            f"mean {statistics.mean(latencies):.2f} ms"
        )

        # Burst: every job's second failure published at once (queueing included).
        await announce(producer, nc, settings.events_stream, failing, 2, now)
        futs = {job: loop.create_future() for job in failing}
        for job, fut in futs.items():
            arrived[(job, 2)] = fut
        t0 = time.perf_counter()
        await asyncio.gather(*(producer.publish(failure(j, 2)) for j in failing))
        done = await asyncio.wait_for(asyncio.gather(*futs.values()), 120)
        elapsed = max(done) - t0
        burst = [(t - t0) * 1000 for t in done]
        print(
            f"burst of {len(failing)} failures: all planned in {elapsed:.2f}s "
            f"({len(failing) / elapsed:.0f} plans/s), p50 {pct(burst, 0.5):.1f} ms, "
            f"p99 {pct(burst, 0.99):.1f} ms after the burst started"
        )
    finally:
        with contextlib.suppress(Exception):
            await producer.broker.stop()
        with contextlib.suppress(Exception):
            await coordinator.bus.broker.stop()
        await coordinator.state.close()
        js = nc.jetstream()
        for stream in (
            settings.events_stream,
            settings.dead_letter_stream,
            settings.progress_stream,
        ):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
        await nc.close()
        removed = await clean(r, settings.registry_prefix)
        print(f"cleaned {removed:,} Redis keys under {settings.registry_prefix}:")
        await r.aclose()


if __name__ == "__main__":
    asyncio.run(main())
