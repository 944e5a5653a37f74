"""Consume → registry transition → ack rate of the registrar, against a bare JetStream loop.

Both read the same N events from the same stream on the same nats-server, in the same run:

* bare:      nats-py durable pull consumer, fetch batches, ack each message (no decoding, no work)
* registrar: the real registrar consumer (decode + validate, Redis transition, explicit ack)

Prints both rates and their ratio for each round, then the median ratio. Usage:
    .venv/bin/python bench/bench_consume.py [--events 10000] [--rounds 3] [--nats URL] [--redis URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from datetime import UTC, datetime

import nats
import redis.asyncio as aioredis
from nats.js.api import AckPolicy, ConsumerConfig

from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointCommittedV1, CheckpointFormat
from ckpt_ha.registrar.app import build as build_registrar
from ckpt_ha.registrar.settings import RegistrarSettings


async def publish_events(bus: Bus, n: int) -> None:
    now = datetime.now(UTC)
    pending = []
    for i in range(n):
        event = build(
            CheckpointCommittedV1(
                job_id=f"job-{i % 50}",
                checkpoint_id=f"ck-{i}",
                uri=f"file:///bench/job-{i % 50}/step-{i}",
                run_id="run-1",
                step=i,
                format=CheckpointFormat.NATIVE,
                shard_count=8,
                total_bytes=1 << 30,
            ),
            source="bench",
            time=now,
            key=str(i),
        )
        pending.append(bus.publish(event))
        if len(pending) >= 500:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


async def bare_rate(url: str, stream: str, subject: str, n: int, batch: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        subject,
        durable="bench-bare",
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_deliver=5),
    )
    got = 0
    start = time.perf_counter()
    while got < n:
        msgs = await sub.fetch(batch, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    await nc.flush()
    elapsed = time.perf_counter() - start
    await nc.close()
    return n / elapsed


async def registrar_rate(settings: RegistrarSettings, n: int) -> float:
    svc = build_registrar(settings)
    r = aioredis.Redis.from_url(settings.redis_url)
    key = svc.registry.keys.state("pending_verification")
    await svc.bus.broker.start()  # like the bare loop, timing starts once subscribed
    start = time.perf_counter()
    while await r.scard(key) < n:  # noqa: ASYNC110 - light polling of Redis, not an event
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - start
    await svc.bus.broker.stop()
    await svc.registry.close()
    await r.aclose()
    return n / elapsed


async def one_round(args: argparse.Namespace) -> tuple[float, float]:
    """One fresh stream, N events, read once by each consumer: (bare rate, registrar rate)."""
    tag = uuid.uuid4().hex[:8]
    settings = RegistrarSettings(
        NATS_URL=args.nats,
        REDIS_URL=args.redis,
        subject_prefix=f"bench{tag}",
        events_stream=f"BENCH_{tag}",
        dead_letter_stream=f"BENCHDLQ_{tag}",
        progress_stream=f"BENCHPR_{tag}",
        registry_prefix=f"bench:{tag}",
        fetch_batch=args.batch,
    )
    producer = Bus(settings.bus(), "bench-producer")
    await producer.broker.start()
    try:
        await publish_events(producer, args.events)
        bare = await bare_rate(
            args.nats,
            settings.events_stream,
            f"{settings.subject_prefix}.ev.checkpoint.>",
            args.events,
            args.batch,
        )
        service = await registrar_rate(settings, args.events)
    finally:
        js = producer.broker.connection.jetstream()
        for stream in (
            settings.events_stream,
            settings.dead_letter_stream,
            settings.progress_stream,
        ):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
        await producer.broker.stop()
        r = aioredis.Redis.from_url(args.redis)
        keys = [k async for k in r.scan_iter(match=f"{settings.registry_prefix}:*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
    return bare, service


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--batch", type=int, default=64, help="fetch batch size, same for both")
    args = ap.parse_args()
    print(f"events per round: {args.events}, fetch batch {args.batch}, rounds {args.rounds}")
    ratios = []
    for i in range(1, args.rounds + 1):
        bare, service = await one_round(args)
        ratios.append(service / bare)
        print(
            f"round {i}: bare nats-py consume+ack {bare:8.0f} msg/s | "
            f"registrar consume→transition→ack {service:8.0f} msg/s | ratio {service / bare:.2f}"
        )
    print(f"median ratio registrar/bare: {statistics.median(ratios):.2f}  (target >= 0.5)")


if __name__ == "__main__":
    import logging

    logging.disable(logging.INFO)
    asyncio.run(main())
