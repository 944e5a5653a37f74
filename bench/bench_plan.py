"""job.failed → resume.planned latency of the restore-coordinator with a large registry.

Fills a private redis-server (started here and removed afterwards, so a million records never
weigh on a shared Redis; ``--redis URL`` uses that one, under a private prefix) with ``--jobs``
times ``--per-job`` checkpoint records written directly in the registry's key layout (the
newest of each job still pending verification, the rest valid), starts the real coordinator
in-process on private NATS streams (provisioned first, as the operator does: services never
create them), announces
``job.started`` for ``--failures`` jobs, then publishes one ``job.failed`` at a time and times
it until its ``resume.planned`` arrives on a plain NATS subscription (that coordinator runs in
the bench's process). Then bursts (all failures of the next attempt published at once, timed
from the first publish to the last plan), each decided by coordinator replicas in processes of
their own, as deployed (the bench's publishing never shares a replica's core): one replica;
with ``--compare`` one replica taking failures one message at a time, as before batching; with
``--replicas 2`` two replicas sharing the durable consumers. Each burst prints the machine's
CPU per plan (every process: replicas, servers, the bench), the replicas' own and the bench's;
for two replicas the ceiling the cores set: ``cores / CPU per plan`` plans a second, so at least
``failures * CPU per plan / cores`` for the burst; each burst prints the load average too.
``--profile PATH`` writes a cProfile (CPU time) of the one-replica burst's replica over that
burst alone; ``--latency N`` times only N failures one at a time first. Cleans its Redis keys
and streams afterwards (in a shared Redis; a private one is removed whole). Usage:
    .venv/bin/python bench/bench_plan.py [--jobs 10000] [--per-job 100] [--failures 1000]
        [--replicas 2] [--compare] [--latency N] [--redis URL] [--profile PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from nats.aio.msg import Msg
from pydantic import SecretStr

from ckpt_ha.bus import streams
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
from ckpt_ha.lab.devstack import procs
from ckpt_ha.registry.keys import RegistryKeys
from ckpt_ha.restore_coordinator import app as coordinator_app
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings

ENV = RuntimeEnvironment(
    framework="torch", framework_version="2.3.0", python_version="3.11.9", image="trainer:1"
)
TOPO = Topology(world_size=8, tensor_parallel=2)
T0 = datetime(2026, 11, 1, tzinfo=UTC)
POLICY = JobPolicy(max_restarts=10, max_same_failure=10)
"""Every burst plans (no restart-loop or same-failure stop over the bench's three attempts)."""


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
            if len(pipe) >= 50:
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
                    policy=POLICY,
                    environment=ENV,
                    topology=TOPO,
                    code_version="abc",
                ),
                source="bench",
                time=now,
                key=f"s{attempt}",
            )
        )
    while True:  # recorded, and in the job index (so the burst is timed alone)
        infos = [
            await nc.jetstream().consumer_info(stream, f"restore-coordinator--{durable}")
            for durable in ("started", "job-index")
        ]
        if all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos):
            return
        await asyncio.sleep(0.1)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def replica_main(
    settings: RestoreCoordinatorSettings,
    ready: Any,
    stop: Any,
    batched: bool = True,
    profile: str | None = None,
    window: tuple[Any, Any] | None = None,
) -> None:
    """A coordinator replica in its own process, on the bench's streams and Redis (as deployed:
    one process per replica, so the bench's own publishing never runs on its core). Not
    ``batched``: failures taken one message at a time (`--compare`). With ``profile``, a
    cProfile (CPU time) of the ``window`` (set when the burst starts, set when it ends) is
    written there."""

    async def serve() -> None:
        if batched:
            svc = build_coordinator(settings)
        else:
            with unbatched_failures():
                svc = build_coordinator(settings)
        await svc.bus.broker.start()
        ready.set()
        if profile is not None and window is not None:
            profiler = cProfile.Profile(time.process_time)  # CPU, not wall
            await asyncio.to_thread(window[0].wait)
            profiler.enable()  # here, on the event loop's thread
            await asyncio.to_thread(window[1].wait)
            profiler.disable()
            profiler.dump_stats(profile)
        await asyncio.to_thread(stop.wait)
        await svc.bus.broker.stop()
        await svc.state.close()

    asyncio.run(serve())


class Replica:
    """One coordinator replica process (`replica_main`)."""

    def __init__(
        self, settings: RestoreCoordinatorSettings, *, batched: bool, profile: str | None = None
    ) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.stop_event = ctx.Event(), ctx.Event()
        self.window = (ctx.Event(), ctx.Event())
        """Set when the burst starts and when it ends: the profile's window."""
        self.proc = ctx.Process(
            target=replica_main,
            args=(settings, self.ready, self.stop_event, batched, profile, self.window),
        )

    async def start(self) -> Replica:
        self.proc.start()
        if not await asyncio.to_thread(self.ready.wait, 120):
            raise RuntimeError("a coordinator replica did not start within 120 s")
        return self

    def cpu_s(self) -> float:
        """CPU seconds the replica process used so far (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def stop(self) -> None:
        for event in self.window:  # a profile not written yet is written now
            event.set()
        self.stop_event.set()
        await asyncio.to_thread(self.proc.join, 60)


@contextlib.contextmanager
def unbatched_failures() -> Iterator[None]:
    """A coordinator built meanwhile takes ``job.failed`` one message at a time (the consumer
    as it was before failures were batched), for `--compare`."""
    taken = coordinator_app.BATCHED.pop("failed")
    try:
        yield
    finally:
        coordinator_app.BATCHED["failed"] = taken


class Plans:
    """When each failure's decision arrived (plain NATS subscription), by (job, attempt)."""

    def __init__(self) -> None:
        self.arrived: dict[tuple[str, int], asyncio.Future[float]] = {}
        self.kinds: dict[str, int] = {}

    async def on_plan(self, msg: Msg) -> None:
        doc = json.loads(msg.data)
        fut = self.arrived.get((doc["data"]["job_id"], doc["data"]["attempt"] - 1))
        if fut is not None and not fut.done():
            kind = doc["type"].rsplit(".v", 1)[0]
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            fut.set_result(time.perf_counter())

    def expect(self, job: str, attempt: int) -> asyncio.Future[float]:
        fut = self.arrived[(job, attempt)] = asyncio.get_running_loop().create_future()
        return fut


def failure(job: str, attempt: int, now: datetime) -> Envelope[EventData]:
    return build(
        JobFailedV1(job_id=job, run_id="run-1", attempt=attempt, last_step=9_950),
        source="bench",
        time=now + timedelta(seconds=attempt),
        key=f"f{attempt}",
    )


async def burst(
    producer: Bus,
    plans: Plans,
    failing: list[str],
    attempt: int,
    now: datetime,
    what: str,
    replicas: list[Replica],
) -> float:
    """Every job's failure of ``attempt`` published at once; the time until the last decision
    arrived. Prints it with the machine's CPU per plan over the burst, and the replicas'."""
    futs = [plans.expect(job, attempt) for job in failing]
    plans.kinds.clear()
    hz = os.sysconf("SC_CLK_TCK")
    busy0, total0 = machine_ticks()
    own0 = time.process_time()
    cpu0 = [r.cpu_s() for r in replicas]
    load = os.getloadavg()[0]
    for r in replicas:
        r.window[0].set()
    t0 = time.perf_counter()
    await asyncio.gather(*(producer.publish(failure(j, attempt, now)) for j in failing))
    published = time.perf_counter() - t0
    done = await asyncio.wait_for(asyncio.gather(*futs), 300)
    elapsed = max(done) - t0
    for r in replicas:
        r.window[1].set()
    busy1, total1 = machine_ticks()
    own = time.process_time() - own0
    served = sum(r.cpu_s() - c for r, c in zip(replicas, cpu0, strict=True))
    per_plan = (busy1 - busy0) / hz / len(failing)
    after = [(t - t0) * 1000 for t in done]
    print(
        f"burst of {len(failing)} failures, {what}: all decided in {elapsed:.2f}s "
        f"({len(failing) / elapsed:.0f} plans/s; {plans.kinds}), p50 {pct(after, 0.5):.1f} ms, "
        f"p99 {pct(after, 0.99):.1f} ms after the burst started (all published after "
        f"{published:.2f}s); machine "
        f"{100 * (busy1 - busy0) / max(total1 - total0, 1):.0f}% busy, "
        f"{1e3 * per_plan:.2f} ms of machine CPU per plan "
        f"(the replicas' processes {1e3 * served / len(failing):.2f} ms, "
        f"the bench's {1e3 * own / len(failing):.2f} ms); load average "
        f"{load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    return per_plan


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--per-job", type=int, default=100)
    ap.add_argument("--failures", type=int, default=1_000)
    ap.add_argument("--replicas", type=int, choices=(1, 2), default=1)
    ap.add_argument(
        "--compare",
        action="store_true",
        help="also the burst with failures taken one at a time (as before batching), same run",
    )
    ap.add_argument(
        "--latency",
        type=int,
        default=None,
        metavar="N",
        help="time only N failures one at a time first (default: every failing job's)",
    )
    ap.add_argument(
        "--profile",
        metavar="PATH",
        help="write a cProfile of the one-replica burst's replica process to PATH",
    )
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--redis", default=None, help="an existing Redis (default: a private one)")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        redis_url = args.redis
        if redis_url is None:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-plan-")))
            server = procs.start_redis(home / "redis-server")
            stack.callback(procs.stop, server)
            redis_url = server.url
        await run(args, redis_url, clean_up=args.redis is not None)


async def run(args: argparse.Namespace, redis_url: str, *, clean_up: bool) -> None:
    tag = uuid.uuid4().hex[:8]
    settings = RestoreCoordinatorSettings(
        NATS_URL=args.nats,
        REDIS_URL=redis_url,
        subject_prefix=f"bench{tag}",
        events_stream=f"BENCH_EV_{tag}",
        dead_letter_stream=f"BENCH_DLQ_{tag}",
        progress_stream=f"BENCH_PR_{tag}",
        registry_prefix=f"bench-plan:{tag}",
        signing_key=SecretStr(uuid.uuid4().hex * 2),  # jobs sign their events (SDK's way)
        storage_root="/tmp/ckpt-ha-bench-plan",
        # Decided at once: the newest checkpoint of each job is pending verification, and a
        # fresh failure would wait up to this grace for it (nak'ed meanwhile). The bench times
        # the decision, not that wait.
        verification_grace_s=0,
        lost_check_interval_s=0,  # no lost-attempt loop: the bench sends no heartbeats
    )
    r = aioredis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=120)
    nc = await nats.connect(args.nats)
    coordinator = build_coordinator(settings)
    producer = Bus(settings.bus(), "bench-runner")
    running: list[Replica] = []
    try:
        start = time.perf_counter()
        await fill(r, settings.registry_prefix, args.jobs, args.per_job)
        total = args.jobs * args.per_job
        print(
            f"filled {total:,} checkpoints across {args.jobs:,} jobs "
            f"in {time.perf_counter() - start:.1f}s "
            f"(redis used_memory {(await r.info('memory'))['used_memory_human']})"
        )
        await streams.provision(nc.jetstream(), settings.bus())  # as the operator does
        await coordinator.bus.broker.start()
        await producer.broker.start()
        failing = [job_name(j) for j in range(0, args.jobs, max(1, args.jobs // args.failures))]
        failing = failing[: args.failures]
        now = datetime.now(UTC)
        await announce(producer, nc, settings.events_stream, failing, 1, now)

        plans = Plans()
        await nc.subscribe(f"{settings.subject_prefix}.ev.resume.planned.*.*", cb=plans.on_plan)
        await nc.subscribe(f"{settings.subject_prefix}.ev.resume.escalated.*.*", cb=plans.on_plan)

        latencies: list[float] = []
        for job in failing[: args.latency]:
            fut = plans.expect(job, 1)
            t0 = time.perf_counter()
            await producer.publish(failure(job, 1, now))
            latencies.append((await asyncio.wait_for(fut, 10) - t0) * 1000)
        if latencies:
            ms = [round(x, 2) for x in (pct(latencies, q) for q in (0.5, 0.9, 0.99))]
            print(
                f"job.failed -> resume.planned, one at a time, {len(latencies)} failures: "
                f"p50 {ms[0]} ms, p90 {ms[1]} ms, p99 {ms[2]} ms, max {max(latencies):.2f} ms, "
                f"mean {statistics.mean(latencies):.2f} ms"
            )

        # Bursts: every job's next failure published at once (queueing included), decided by
        # replica processes (the in-process coordinator above stops first).
        await coordinator.bus.broker.stop()
        await coordinator.state.close()
        first = await Replica(settings, batched=True, profile=args.profile).start()
        running.append(first)
        await announce(producer, nc, settings.events_stream, failing, 2, now)
        per_plan = await burst(producer, plans, failing, 2, now, "one replica", [first])
        if args.compare:
            # The same burst, failures taken one at a time as before batching.
            await first.stop()
            if args.profile:
                print(f"  the one-replica burst's replica profile: {args.profile}")
            unbatched = await Replica(settings, batched=False).start()
            running.append(unbatched)
            await announce(producer, nc, settings.events_stream, failing, 3, now)
            await burst(
                producer, plans, failing, 3, now, "one replica, one failure at a time", [unbatched]
            )
            await unbatched.stop()
            first = await Replica(settings, batched=True).start()
            running.append(first)
        if args.replicas == 2:
            second = await Replica(settings, batched=True).start()
            running.append(second)
            await announce(producer, nc, settings.events_stream, failing, 4, now)
            await burst(producer, plans, failing, 4, now, "two replicas", [first, second])
            cores = os.cpu_count() or 1
            print(
                f"  the ceiling the {cores} cores set for two replicas: "
                f"{cores / per_plan:.0f} plans/s, so {len(failing)} plans at "
                f"{1e3 * per_plan:.2f} ms of machine CPU each (one replica's burst, everyone's "
                f"work on the machine counted) take at least {len(failing) * per_plan / cores:.2f}s"
            )
    finally:
        for replica in running:
            if replica.proc.is_alive():
                await replica.stop()
        if args.profile and not args.compare and running:
            print(f"  the one-replica burst's replica profile: {args.profile}")
        with contextlib.suppress(Exception):
            await producer.broker.stop()
        with contextlib.suppress(Exception):
            await coordinator.bus.broker.stop()
        with contextlib.suppress(Exception):
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
        if clean_up:  # a private redis-server goes away whole
            removed = await clean(r, settings.registry_prefix)
            print(f"cleaned {removed:,} Redis keys under {settings.registry_prefix}:")
        await r.aclose()


if __name__ == "__main__":
    asyncio.run(main())
