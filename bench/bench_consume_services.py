"""Consume → handle → ack rate of the integrity-checker and the restore-coordinator, each against
a bare JetStream loop reading the same stream on the same nats-server in the same run.

For each service and round: a fresh stream (provisioned as the operator does), N events of the
kind that service gets at volume, then

* bare:    nats-py durable pull consumer, fetch batches, ack each message (no decoding, no work)
           (`bench_consume.bare_rate`, the registrar bench's loop);
* service: the real service's consumers (built by its ``app.build``, only the bus started: its
           background loops off), timed from subscription until every event is settled.

Which events:

* restore-coordinator: ``job.heartbeat`` and ``job.progress`` (half each), signed with the job
  key like a runner signs them, for ``--jobs`` running attempts (each one ``job.started`` with a
  heartbeat deadline first, so every report moves a live watch: the lost-attempt path). This is
  what the coordinator gets at volume: every running job reports every few seconds; failures,
  plans and verdicts are rare. The starts are handled by the service before the reports are
  published (a warm-up, not timed); reports are in the progress stream, which the bare loop
  reads (the starts are in the event stream).
* integrity-checker: ``checkpoint.committed`` of TINY real checkpoints (a native manifest and one
  64-byte shard each, written to a temp storage root before the run). The checker's path per
  commit is registry read → verify (storage reads, offloaded to a thread) → publish the verdict
  → ack. With tiny checkpoints the byte I/O is negligible, so the figure is the consume path
  (admission, registry read, thread hand-off, verdict publish), not disk speed; events it
  decides without bytes (a commit already decided) would skip the verify and the publish and
  so would not measure the path a commit normally takes. Verification throughput on real sizes
  is `bench_verify.py`.

Besides the rates, each round prints this process's CPU time per message for both loops
(``cpu_us_*``; nats-server and Redis not included): less swayed than the rates when other work
shares the machine. Every event passes admission (the ``job.*`` ones are signed); the dead
letters stored per round are printed and must be 0. Usage:
    .venv/bin/python bench/bench_consume_services.py [--events 5000] [--jobs 500] [--rounds 3]
        [--service checker|coordinator|both] [--profile DIR] [--nats URL] [--redis URL]

``--profile TEMPLATE`` (e.g. ``bench/profiles/{service}-after.txt``) runs each service side under
cProfile (one extra round, not counted) and writes the top 25 functions by cumulative and by own
time there (``{service}``: ``checker`` or ``coordinator``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import secrets
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from bench_consume import BARE_CPU, bare_rate
from pydantic import SecretStr

from ckpt_ha.bus import streams
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.contracts.job import JobHeartbeatV1, JobProgressV1, JobStartedV2
from ckpt_ha.formats import native
from ckpt_ha.integrity_checker.app import build as build_checker
from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
from ckpt_ha.runtime import heap
from ckpt_ha.runtime.service import Service
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.storage import FsStore

Settings = IntegrityCheckerSettings | RestoreCoordinatorSettings


async def publish_all(bus: Bus, datas: list[EventData], start: datetime) -> None:
    pending = []
    for i, data in enumerate(datas):
        # Event times a millisecond apart: each report is newer than the one before.
        event = build(data, source="bench", time=start + timedelta(milliseconds=i), key=str(i))
        pending.append(bus.publish(event))
        if len(pending) >= 500:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


def coordinator_starts(jobs: int) -> list[EventData]:
    return [
        JobStartedV2(job_id=f"job-{j}", run_id="run-1", attempt=1, heartbeat_s=30)
        for j in range(jobs)
    ]


def coordinator_events(n: int, jobs: int) -> list[EventData]:
    datas: list[EventData] = []
    for i in range(n):
        job = f"job-{i % jobs}"
        if i % 2:
            datas.append(JobHeartbeatV1(job_id=job, run_id="run-1", sequence=i, last_step=i))
        else:
            datas.append(
                JobProgressV1(job_id=job, run_id="run-1", step=i, metrics={"loss": 1.0 / (i + 1)})
            )
    return datas


def checker_events(n: int, jobs: int, root: Path) -> list[EventData]:
    """N tiny native checkpoints on disk, and their commits."""
    store = FsStore(root)
    now = datetime.now(UTC)
    datas: list[EventData] = []
    for i in range(n):
        job, key = f"job-{i % jobs}", f"job-{i % jobs}/step-{i}"
        native.write(store, key, {"rank-0.bin": bytes(64)}, step=i, created_at=now)
        datas.append(
            CheckpointCommittedV1(
                job_id=job,
                checkpoint_id=f"ck-{i}",
                uri=store.uri(key),
                run_id="run-1",
                step=i,
                format=CheckpointFormat.NATIVE,
                shard_count=1,
                total_bytes=64,
            )
        )
    return datas


async def settled(svc: Service, n: int) -> tuple[float, dict[str, int]]:
    """Start the service's consumers; seconds until ``n`` deliveries were acked or
    dead-lettered, and the outcome counts."""
    counts: dict[str, int] = {}
    done = asyncio.Event()

    def count(consumer: str, outcome: str) -> None:
        counts[outcome] = counts.get(outcome, 0) + 1
        if counts.get("ack", 0) + counts.get("dead_letter", 0) >= n:
            done.set()

    svc.bus.dead_letters.on_outcome = count
    heap.settle()  # as `Service.run` does before it serves
    await svc.bus.broker.start()  # like the bare loop, timing starts once subscribed
    start = time.perf_counter()
    await asyncio.wait_for(done.wait(), timeout=600)
    elapsed = time.perf_counter() - start
    await svc.bus.broker.stop()
    return elapsed, counts


async def dead_letters_stored(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(stream)
        return info.state.messages
    finally:
        await nc.close()


async def one_round(
    args: argparse.Namespace,
    service: str,
    profile: cProfile.Profile | None = None,
) -> tuple[float, float, int, dict[str, int]]:
    """(bare rate, service rate, dead letters stored, outcome counts) on a fresh stream."""
    tag = uuid.uuid4().hex[:8]
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    common: dict[str, Any] = {
        "NATS_URL": args.nats,
        "REDIS_URL": args.redis,
        "subject_prefix": f"bench{tag}",
        "events_stream": f"BENCH_{tag}",
        "dead_letter_stream": f"BENCHDLQ_{tag}",
        "progress_stream": f"BENCHPR_{tag}",
        "registry_prefix": f"bench:{tag}",
        "fetch_batch": args.batch,
        "signing_key": SecretStr(secrets.token_hex(32)),
        "storage_root": str(root),
    }
    settings: Settings
    make: Callable[[Any], Service]
    warmup: list[EventData] = []
    if service == "coordinator":
        settings = RestoreCoordinatorSettings(**common, lost_check_interval_s=0)
        make = build_coordinator
        warmup = coordinator_starts(args.jobs)
        datas = coordinator_events(args.events, args.jobs)
    else:
        settings = IntegrityCheckerSettings(**common, scrub_interval_s=0, reconcile_interval_s=0)
        make = build_checker
        datas = checker_events(args.events, args.jobs, root)
    total = len(datas)
    nc = await nats.connect(args.nats)
    await streams.provision(nc.jetstream(), settings.bus())  # as the operator does
    await nc.close()
    producer = Bus(settings.bus(), "bench-producer")  # holds the key: signs job.* events
    await producer.broker.start()
    try:
        start = datetime.now(UTC) - timedelta(hours=1)
        if warmup:
            await publish_all(producer, warmup, start)
            svc = make(settings)
            await settled(svc, len(warmup))
            if svc.on_stop is not None:
                await svc.on_stop()
        await publish_all(producer, datas, start + timedelta(minutes=1))
        # The bare loop reads the same messages the service will: the coordinator's reports are
        # in the progress stream (its warm-up starts, already handled, are not), the checker's
        # commits in the event stream.
        if service == "coordinator":
            where, filter_subject = settings.progress_stream, f"{settings.subject_prefix}.ev.job.>"
        else:
            where, filter_subject = settings.events_stream, f"{settings.subject_prefix}.ev.>"
        bare = await bare_rate(args.nats, where, filter_subject, total, args.batch)
        bare_cpu = BARE_CPU[-1]  # measured in the bare loop's own process
        svc = make(settings)
        if profile is not None:
            profile.enable()
        cpu = time.process_time()
        elapsed, counts = await settled(svc, total)
        service_cpu = (time.process_time() - cpu) / total
        if profile is not None:
            profile.disable()
        if svc.on_stop is not None:
            await svc.on_stop()
        dead = await dead_letters_stored(args.nats, settings.dead_letter_stream)
    finally:
        await _cleanup(producer, settings, args.redis)
        shutil.rmtree(root, ignore_errors=True)
    counts["cpu_us_bare"] = round(bare_cpu * 1e6)
    counts["cpu_us_service"] = round(service_cpu * 1e6)
    return bare, total / elapsed, dead, counts


async def _cleanup(producer: Bus, settings: ServiceSettings, redis_url: str) -> None:
    js = producer.broker.connection.jetstream()
    for stream in (settings.events_stream, settings.dead_letter_stream, settings.progress_stream):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    await producer.broker.stop()
    r = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in r.scan_iter(match=f"{settings.registry_prefix}:*")]
    if keys:
        await r.delete(*keys)
    await r.aclose()


def write_profile(profile: cProfile.Profile, path: Path, title: str) -> None:
    out = io.StringIO()
    out.write(f"{title}\n\n")
    for order in ("cumulative", "tottime"):
        out.write(f"=== top 25 by {order} ===\n")
        pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order).print_stats(25)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.getvalue())


async def run_service(args: argparse.Namespace, service: str) -> None:
    name = {"checker": "integrity-checker", "coordinator": "restore-coordinator"}[service]
    path = {"checker": "commit→verify→publish→ack", "coordinator": "report→state→ack"}[service]
    ratios = []
    for i in range(1, args.rounds + 1):
        bare, rate, dead, counts = await one_round(args, service)
        ratios.append(rate / bare)
        print(
            f"{name} round {i}: bare nats-py consume+ack {bare:8.0f} msg/s | "
            f"{path} {rate:8.0f} msg/s | ratio {rate / bare:.2f} | dead letters {dead} "
            f"| outcomes {counts}"
        )
    print(f"{name}: median ratio service/bare {statistics.median(ratios):.2f}  (target >= 0.5)")
    if args.profile:
        profile = cProfile.Profile()
        _, rate, _, _ = await one_round(args, service, profile)
        target = Path(args.profile.format(service=service))
        write_profile(
            profile,
            target,
            f"{name} consume path under cProfile ({args.events} events, {rate:.0f} msg/s profiled)",
        )
        print(f"{name}: profile written to {target}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--service", choices=["checker", "coordinator", "both"], default="both")
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--batch", type=int, default=64, help="fetch batch size, same for both")
    ap.add_argument("--profile", default=None, help="cProfile summary path, {service} in it")
    args = ap.parse_args()
    print(
        f"events per round: {args.events} over {args.jobs} jobs, fetch batch {args.batch}, "
        f"rounds {args.rounds}"
    )
    for service in ("checker", "coordinator"):
        if args.service in (service, "both"):
            await run_service(args, service)


def _run(main: Callable[[], Awaitable[None]]) -> None:
    import logging

    logging.disable(logging.INFO)
    asyncio.run(main())  # type: ignore[arg-type]


if __name__ == "__main__":
    _run(main)
