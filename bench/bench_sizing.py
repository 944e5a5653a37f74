"""What a checkpoint costs ckpt-ha itself: event-stream bytes and Redis memory, measured on a
private stack, for the sizing in docs/DEPLOY.md.

A private nats-server (JetStream on disk) and redis-server, the five services as processes
(`ckpt-ha up` on them), filesystem storage. ``--jobs`` jobs each save ``--per-job`` native
checkpoints of ``--arrays`` arrays through the SDK (signed ``writing`` and ``committed``, as a
training job does); the services verify and register them. Then retention runs on a clock moved
past the default tier's ages and grace, so all but the newest ``keep_last`` of each job expire and
are deleted (their records become tombstones). After each phase it prints:

* the stream: messages and bytes (JetStream's own count), bytes per checkpoint, and the encoded
  size of each event type;
* Redis: ``used_memory`` growth and ``MEMORY USAGE`` of the registry's keys by family, per
  checkpoint (live record) and per tombstone.

Usage (needs nothing listening anywhere; starts and stops its own servers):
    .venv/bin/python bench/bench_sizing.py [--jobs 20] [--per-job 25] [--arrays 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import nats
import numpy as np
import redis.asyncio as aioredis

from ckpt_ha import sdk
from ckpt_ha.bus.broker import Bus
from ckpt_ha.contracts import signing
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.lab.devstack import procs, stack
from ckpt_ha.ops.rebuild import rebuild_registry
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor import app as janitor_app
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.store import RedisResumes
from ckpt_ha.runtime import local_stack
from ckpt_ha.storage import key_for_uri, open_store
from ckpt_ha.telemetry.metrics import ServiceMetrics

STREAM = "CKPT_EVENTS"
PREFIX = "ckpt-ha"


class ShiftedClock:
    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


async def stream_figures(url: str) -> tuple[int, int, dict[str, list[int]]]:
    """(messages, bytes as JetStream counts them, encoded sizes by event type)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(STREAM)
        sizes: dict[str, list[int]] = defaultdict(list)
        # No filter: the event stream lists its subjects, and ">" is not within them.
        sub = await js.pull_subscribe("", stream=STREAM)
        left = info.state.messages
        while left > 0:
            batch = await sub.fetch(min(left, 500), timeout=10)
            for m in batch:
                kind = ".".join(m.subject.split(".")[2:4])
                head = sum(len(k) + len(v) for k, v in (m.headers or {}).items())
                sizes[kind].append(len(m.data) + head + len(m.subject))
                await m.ack()
            left -= len(batch)
        return info.state.messages, info.state.bytes, sizes
    finally:
        await nc.close()


def family(key: str) -> str:
    """``ckpt-ha:ckpt:job-3-ab12`` → ``ckpt-ha:ckpt:*``: ids and names folded away."""
    parts = key.split(":")
    kept = [p for p in parts[:3] if not re.search(r"\d", p)]
    return ":".join(kept) + ":*"


async def redis_figures(url: str) -> tuple[int, dict[str, tuple[int, int]]]:
    """(used_memory, {key family: (keys, bytes)})."""
    r = aioredis.Redis.from_url(url)
    try:
        await r.execute_command("MEMORY", "PURGE")
        used = int((await r.info("memory"))["used_memory"])
        by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        async for raw in r.scan_iter(match=f"{PREFIX}:*", count=1000):
            key = raw.decode()
            usage = await r.memory_usage(key, samples=0) or 0
            entry = by[family(key)]
            entry[0] += 1
            entry[1] += usage
        return used, {k: (v[0], v[1]) for k, v in sorted(by.items())}
    finally:
        await r.aclose()


async def count_states(registry: Registry) -> dict[CheckpointState, int]:
    found: dict[CheckpointState, int] = {}
    for state in CheckpointState:
        found[state] = len(await registry.by_state(state))
    return found


def report(title: str, figures: tuple[int, int, dict[str, list[int]]], per: int) -> None:
    messages, nbytes, sizes = figures
    print(f"\n== {title}: stream {messages} messages, {nbytes} bytes "
          f"({nbytes / per:.0f} bytes per checkpoint)")  # fmt: skip
    for kind, values in sorted(sizes.items()):
        mean = sum(values) / len(values)
        print(f"   {kind:28s} {len(values):6d} events, {mean:7.0f} bytes each (data+headers)")


def report_redis(
    title: str, base: int, figures: tuple[int, dict[str, tuple[int, int]]], per: int
) -> None:
    used, by = figures
    print(f"   redis used_memory +{used - base} bytes ({(used - base) / per:.0f} per checkpoint)")
    for fam, (keys, nbytes) in by.items():
        print(f"   {fam:28s} {keys:6d} keys, {nbytes:9d} bytes")
    total = sum(b for _, b in by.values())
    print(f"   {title}: registry keys {total} bytes, {total / per:.0f} per checkpoint")


async def measure(args: argparse.Namespace, tmp: Path) -> None:
    nats_proc = procs.start_nats(tmp / "nats-server")
    redis_proc = procs.start_redis(tmp / "redis-server")
    home = tmp / "home"
    master = secrets.token_hex(32)
    keep = local_stack.StackSecrets.of(home)
    keep.folder.mkdir(parents=True, exist_ok=True)
    keep.signing_key.write_text(master + "\n")
    os.chmod(keep.signing_key, 0o600)
    root = tmp / "storage"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKPT_HA_")},
        "NATS_URL": nats_proc.url,
        "REDIS_URL": redis_proc.url,
        "CKPT_HA_HOME": str(home),
        "CKPT_HA_STORAGE_ROOT": str(root),
        "CKPT_HA_SCRUB_INTERVAL_S": "0",
        "CKPT_HA_RETENTION_INTERVAL_S": "0",
        "CKPT_HA_POLL_INTERVAL_S": "1",
    }
    try:
        base_used, _ = await redis_figures(redis_proc.url)
        state = stack.up(home, env)
        n = args.jobs * args.per_job
        started = time.monotonic()
        for j in range(args.jobs):
            job = f"size-{j:05d}"
            key = signing.job_key(bytes.fromhex(master), job)
            bus = sdk.BusEndpoint(state.nats_url, job_key=key, timeout_s=5.0)  # unsecured servers
            for i in range(args.per_job):
                tensors = {f"layer{a}": np.full(256, i, np.float32) for a in range(args.arrays)}
                sdk.save(str(root), job, (i + 1) * 100, {"model": tensors, "step": i},
                         run_id=f"run-{j}", bus=bus)  # fmt: skip
        client = connect(redis_proc.url)
        registry = Registry(client)
        while (await count_states(registry))[CheckpointState.VALID] < n:
            await asyncio.sleep(0.5)
            if time.monotonic() - started > 600:
                raise SystemExit(f"not all valid after 600 s: {await count_states(registry)}")
        took = time.monotonic() - started
        print(f"{n} checkpoints ({args.jobs} jobs x {args.per_job}, {args.arrays} arrays, "
              f"{args.arrays + 2} files each) valid after {took:.1f} s")  # fmt: skip
        await asyncio.sleep(2)  # the registrar's last `registered`, if any
        report("after intake (all valid)", await stream_figures(state.nats_url), n)
        report_redis("after intake", base_used, await redis_figures(redis_proc.url), n)

        clock = ShiftedClock()
        bus = Bus(local_stack.bus_config(state), "retention-janitor")
        await bus.broker.start()
        try:
            # The stack's janitor service keeps the view of resumes these rounds read.
            janitor = Janitor(registry, RedisResumes(client, PREFIX, 30 * 24 * 3600),
                              janitor_app.feed(bus), open_store(str(root)), bus, clock,
                              RetentionMetrics(ServiceMetrics("retention-janitor")))  # fmt: skip
            for days in (0, 40, 80):  # expire, then delete after the grace
                clock.offset = timedelta(days=days)
                await janitor.run_once()
                await asyncio.sleep(2)
        finally:
            await bus.broker.stop()
        await asyncio.sleep(3)
        states = await count_states(registry)
        print("\nafter retention: " + ", ".join(f"{s.value}={c}" for s, c in states.items() if c))
        report("after retention", await stream_figures(state.nats_url), n)
        report_redis("after retention", base_used, await redis_figures(redis_proc.url), n)
        disk = sum(f.stat().st_size for f in (tmp / "nats-server").rglob("*") if f.is_file())
        print(f"   nats-server store on disk: {disk} bytes ({disk / n:.0f} per checkpoint)")

        stack.down(home)  # a rebuild runs with the writers of the registry stopped
        begun = time.monotonic()
        rebuilt = await rebuild_registry(
            registry, local_stack.bus_config(state), partial(key_for_uri, open_store(str(root))),
            clear=True,
        )  # fmt: skip
        took = time.monotonic() - begun
        print(f"\n== rebuild --clear from the stream: {rebuilt.read} events in {took:.2f} s "
              f"({rebuilt.read / took:.0f} events/s)")  # fmt: skip
        after = await count_states(registry)
        assert after == states, f"the rebuild differs: {after} != {states}"
        await client.aclose()
    finally:
        stack.down(home)
        for proc in (redis_proc, nats_proc):
            procs.stop(proc, timeout=15)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--per-job", type=int, default=25)
    ap.add_argument("--arrays", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.suppress(KeyboardInterrupt):
        asyncio.run(measure(args, Path(tmp)))


if __name__ == "__main__":
    main()
