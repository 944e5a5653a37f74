"""What progress reports cost at fleet scale, and that the progress stream's limits hold it.

Sizing for ``--jobs`` jobs reporting every ``--interval`` seconds (10,000 every 10 s: 1,000
reports a second), from the size of a real report: a ``job.progress`` (and a ``job.heartbeat``)
envelope with typical metrics, signed with its job's key as the SDK and the runner sign it. It
prints the publish rate, what an unlimited stream would grow by per hour and per day (what the
event stream grew by before reports had their own stream, and what a registry rebuild had to
read), and what the progress stream holds in steady state under its default limits
(``CKPT_HA_PROGRESS_MAX_AGE_S``, ``_PER_JOB``, ``_MAX_BYTES``: the tightest one wins).

Then a live run on the given nats-server (the shared one: private, uniquely named streams, deleted
afterwards) for ``--seconds``: a publisher process sends signed reports at ``--rate`` a second
across ``--jobs`` jobs (each job's subject in turn) into a private progress stream provisioned
with ``--age``, ``--per-job`` and ``--max-bytes`` (small, so that the limits act within the
run), while the real restore-coordinator (in this process, its own Redis prefix) consumes them.
Every 2 s it prints the stream's messages and bytes (never above ``--max-bytes``) and the
coordinator's progress consumer: delivered so far and its lag (reports not yet delivered). After
the publisher stops, it waits up to 60 s for the coordinator to drain.

Usage (NATS and Redis on the default ports):
    .venv/bin/python bench/bench_progress.py [--jobs 10000] [--interval 10] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
import uuid
from datetime import UTC, datetime

import nats
import redis.asyncio as aioredis

from ckpt_ha.bus import streams
from ckpt_ha.bus.admission import job_key
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import Envelope, EventData, build, framing
from ckpt_ha.contracts.job import JobHeartbeatV1, JobProgressV1
from ckpt_ha.restore_coordinator.app import build as build_coordinator
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings

SIGNING_KEY = "6b" * 32
MIB = 1024 * 1024


def report(job: str, step: int, now: datetime) -> Envelope[EventData]:
    """A typical report: a few metrics, the data position and the RNG fingerprint."""
    data = JobProgressV1(
        job_id=job,
        run_id="run-2026-11-30-a",
        attempt=1,
        step=step,
        data_position=step * 2048,
        rng_fingerprint="9f2c4e1a7b3d5f60",
        metrics={"loss": 2.3141, "lr": 0.00029, "grad_norm": 0.8731, "tokens_per_s": 41235.5},
    )
    return build(data, source="ckpt-ha-sdk", time=now, key=f"{job}|{step}")


def heartbeat(job: str, seq: int, now: datetime) -> Envelope[EventData]:
    data = JobHeartbeatV1(job_id=job, run_id="run-2026-11-30-a", sequence=seq, last_step=seq)
    return build(data, source="ckpt-ha-run", time=now, key=f"{job}|hb|{seq}")


def wire(cfg: BusConfig, event: Envelope[EventData]) -> tuple[str, bytes, dict[str, str]]:
    """Subject, body and headers as published: the dedupe id and the job's signature."""
    body, subject = event.to_bytes(), framing.subject(cfg.prefix, event)
    return subject, body, framing.headers(event.id, subject, body, key=job_key(cfg, event))


def encoded(cfg: BusConfig, event: Envelope[EventData]) -> int:
    subject, body, headers = wire(cfg, event)
    return len(subject) + len(body) + sum(len(k) + len(v) + 4 for k, v in headers.items())


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def sizing(args: argparse.Namespace, cfg: BusConfig, stored: float | None) -> None:
    now = datetime.now(UTC)
    p = encoded(cfg, report("job-00042", 123456, now))
    h = encoded(cfg, heartbeat("job-00042", 1234, now))
    rate = args.jobs / args.interval
    defaults = BusConfig()
    print(f"== sizing: {args.jobs:,} jobs, a report every {args.interval:g} s ==")
    print(f"job.progress encoded (subject + headers + signed body): {p} B")
    print(f"job.heartbeat encoded: {h} B")
    if stored is not None:
        print(f"stored per report (JetStream's own count, measured below): {stored:.0f} B")
    size = stored if stored is not None else p + 40
    print(f"publish rate: {rate:,.0f} reports/s (+{rate:,.0f}/s heartbeats from `ckpt-ha run`)")
    for label, per_s in (("progress", rate), ("progress + heartbeats", 2 * rate)):
        hour, day = per_s * 3600 * size, per_s * 86400 * size
        print(
            f"unlimited stream, {label}: {human(hour)}/hour, {human(day)}/day, "
            f"{per_s * 86400 / 1e6:,.1f} M messages/day"
        )
    age = defaults.progress_max_age_s
    per_job = defaults.progress_per_job
    cap = defaults.progress_max_bytes
    for label, types, per_s in (("progress", 1, rate), ("progress + heartbeats", 2, 2 * rate)):
        by_age = per_s * age * size
        by_job = args.jobs * types * per_job * size
        held = min(by_age, by_job, cap)
        binding = {by_age: "max age", by_job: "per job", cap: "max bytes"}[held]
        print(
            f"progress stream, {label}, default limits (age {age / 3600:g} h, {per_job} per job "
            f"and type, {human(cap)}): by age {human(by_age)}, by per-job {human(by_job)} -> "
            f"holds {human(held)} ({binding} binds), {held / size / 1e6:,.2f} M messages"
        )
    print(
        f"each job keeps its newest {per_job} reports: {per_job * args.interval / 60:,.1f} min of "
        "history at this interval"
    )


async def publisher(args: argparse.Namespace) -> None:
    """Child process: ``--rate`` signed reports a second for ``--seconds``, paced in 50 ms
    ticks, each job's subject in turn."""
    cfg = BusConfig(url=args.nats, prefix=args.prefix, signing_keys=(bytes.fromhex(SIGNING_KEY),))
    nc = await nats.connect(args.nats)
    js = nc.jetstream(publish_async_max_pending=4000)
    tick, sent = 0.05, 0
    steps: dict[int, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    futures: list[asyncio.Future[object]] = []
    while (elapsed := loop.time() - start) < args.seconds:
        due = int((elapsed + tick) * args.rate)
        now = datetime.now(UTC)
        while sent < due:
            job = sent % args.jobs
            steps[job] = steps.get(job, 0) + 1
            subject, body, headers = wire(cfg, report(f"job-{job:05d}", steps[job], now))
            futures.append(await js.publish_async(subject, body, headers=headers))
            sent += 1
        await asyncio.sleep(max(0.0, start + (due / args.rate) - loop.time()))
    results = await asyncio.gather(*futures, return_exceptions=True)
    failed = sum(isinstance(r, BaseException) for r in results)
    took = loop.time() - start
    print(
        f"publisher: {sent:,} reports in {took:.1f} s = {sent / took:,.0f}/s, {failed} refused",
        flush=True,
    )
    await nc.close()


async def live(args: argparse.Namespace) -> float | None:
    tag = uuid.uuid4().hex[:8]
    settings = RestoreCoordinatorSettings(
        NATS_URL=args.nats,
        REDIS_URL=args.redis,
        subject_prefix=f"benchpr{tag}",
        events_stream=f"BENCHPR_EV_{tag}",
        dead_letter_stream=f"BENCHPR_DLQ_{tag}",
        progress_stream=f"BENCHPR_PROGRESS_{tag}",
        progress_max_age_s=args.age,
        progress_per_job=args.per_job,
        progress_max_bytes=args.max_bytes,
        registry_prefix=f"bench-progress:{tag}",
        storage_root="/tmp/ckpt-ha-bench-progress",
        lost_check_interval_s=0,
        signing_key=SIGNING_KEY,
    )
    cfg = settings.bus()
    nc = await nats.connect(args.nats)
    js = nc.jetstream()
    stored: float | None = None
    coordinator = None
    try:
        print(
            f"== live: {args.rate:,} reports/s for {args.seconds} s over {args.jobs:,} jobs into "
            f"{cfg.progress_stream} (max age {args.age:g} s, {args.per_job} per job, max bytes "
            f"{human(args.max_bytes)}), consumed by the restore-coordinator =="
        )
        await streams.provision(js, cfg)
        coordinator = build_coordinator(settings)
        await coordinator.bus.broker.start()
        durable = coordinator.bus.durable_name("progress")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--publish-only",
            "--prefix",
            cfg.prefix,
            *("--nats", args.nats, "--rate", str(args.rate), "--jobs", str(args.jobs)),
            *("--seconds", str(args.seconds)),
        )
        start = time.perf_counter()
        peak = 0
        drained_at: float | None = None
        while True:
            await asyncio.sleep(2.0)
            info = await js.stream_info(cfg.progress_stream)
            ci = await js.consumer_info(cfg.progress_stream, durable)
            lag = (ci.num_pending or 0) + (ci.num_ack_pending or 0)
            handled = (ci.delivered.consumer_seq or 0) - (ci.num_ack_pending or 0)
            skipped = info.state.last_seq - handled - lag
            peak = max(peak, info.state.bytes)
            t = time.perf_counter() - start
            print(
                f"t={t:5.1f}s stream: {info.state.messages:7,} msgs {human(info.state.bytes):>9} "
                f"(first seq {info.state.first_seq:,}, last {info.state.last_seq:,}) | "
                f"coordinator: handled {handled:,} ({handled / t:,.0f}/s) lag {lag:,}, "
                f"dropped by the limits before delivery {skipped:,}"
            )
            if info.state.messages:
                stored = info.state.bytes / info.state.messages
            if child.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(child.wait(), 0.01)
                continue
            if lag == 0:
                drained_at = t
                break
            if t > args.seconds + 60:
                break
        over = "NO" if peak <= args.max_bytes else "YES"
        print(
            f"peak stream bytes {human(peak)} vs max {human(args.max_bytes)} (over: {over}); "
            + (
                f"coordinator drained {drained_at:.1f} s after start"
                if drained_at is not None
                else "coordinator did not drain within 60 s of the end"
            )
        )
    finally:
        if coordinator is not None:
            await coordinator.bus.broker.stop()
            await coordinator.state.close()
        for name in (cfg.events_stream, cfg.dead_letter_stream, cfg.progress_stream):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
        await nc.close()
        r = aioredis.Redis.from_url(args.redis)
        keys = [k async for k in r.scan_iter(match=f"{settings.registry_prefix}:*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
    return stored


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=None, help="live reports/s (jobs/interval)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--age", type=float, default=20.0, help="live stream's max age, s")
    ap.add_argument("--per-job", type=int, default=100)
    ap.add_argument("--max-bytes", type=int, default=4 * MIB)
    ap.add_argument("--publish-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.rate = args.rate or round(args.jobs / args.interval)
    if args.publish_only:
        await publisher(args)
        return
    stored = await live(args) if args.seconds > 0 else None
    cfg = dataclasses.replace(BusConfig(), signing_keys=(bytes.fromhex(SIGNING_KEY),))
    sizing(args, cfg, stored)


if __name__ == "__main__":
    import logging

    logging.disable(logging.INFO)  # faststream logs every message it handles
    asyncio.run(main())
