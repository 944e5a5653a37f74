"""Writer-watcher cost at 100,000 checkpoint folders: per-scan time and memory, on a local
filesystem and on S3 (moto's server), and the S3 poll cost per minute.

Filesystem: ``<root>/<job>/<step>/`` with what the SDK writes for a native checkpoint (one small
shard, then ``manifest.json``), ``--jobs`` x ``--per-job`` folders (default 1000 x 100). The
real `Watcher.scan_once` runs on it (publisher, registry and watch state are in-memory stand-ins:
this measures listing, evidence reads and decisions). Printed:

* the first scan (everything listed and read), its time, its memory peak (tracemalloc) and what
  the watcher keeps per folder afterwards (cursor fingerprint, tracked entry);
* with change notifications naming what changed (as `notify.Inotify` does): an idle scan and a
  scan after k = 1 and k = 100 folders changed;
* the periodic full listing (and every scan without notifications): idle and k changed;
* for comparison, a scan that reads every folder's manifest (what each scan did before the
  listing cursor).

S3: ``--s3-folders`` folders of one manifest each in a moto bucket (uploading 100,000 objects to
moto is slow; the default is smaller and the 100,000 figures are extrapolated, labelled so),
the LIST and GET requests each scan sends, and the poll cost per minute and per month at the
poll interval (ListObjectsV2 returns at most 1,000 keys: one request per 1,000 objects, every
poll; S3 has no change feed to list less).

Usage:
    .venv/bin/python bench/bench_watcher.py [--jobs 1000] [--per-job 100] [--s3-folders 10000]
        [--poll-s 2] [--objects-per-folder 9] [--rounds 3] [--skip-s3] [--skip-fs]
        [--redis redis://127.0.0.1:6379/0]

With ``--redis`` the timed filesystem scans keep their watch state in Redis (`RedisWatchState`,
under a random prefix, deleted afterwards), so a scan includes saving what changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import redis.asyncio as aioredis
from moto.server import ThreadedMotoServer

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointIdentity, CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import native
from ckpt_ha.storage import FsStore, ObjectStore, S3Store, bounded
from ckpt_ha.writer_watcher.adapters import RedisWatchState, state_keys
from ckpt_ha.writer_watcher.domain import Tracked, WatchState
from ckpt_ha.writer_watcher.handlers import Watcher
from ckpt_ha.writer_watcher.ports import WatchStateStore
from ckpt_ha.writer_watcher.settings import WriterWatcherSettings

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
LIST_PRICE_PER_1000 = 0.005
"""USD per 1,000 LIST requests (S3 Standard, us-east-1 list price)."""
MINUTES_PER_MONTH = 30 * 24 * 60
SHARD = b"w" * 64


# -- in-memory stand-ins for the bus, the registry and the watch state -------------------------


class CountingPublisher:
    def __init__(self) -> None:
        self.count = 0

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        self.count += 1
        return event

    async def publish_caused_by(
        self, event: Envelope[EventData], cause: Envelope[EventData]
    ) -> Envelope[EventData]:
        return await self.publish(event)


class EmptyRegistry:
    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        return None

    async def by_job(self, job_id: str) -> list[CheckpointRecord]:
        return []

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        return []


class MemoryState:
    """Keeps the saved state by reference (as little extra memory as possible)."""

    def __init__(self) -> None:
        self.saved = WatchState()

    async def load(self) -> WatchState:
        return WatchState(dict(self.saved.folders))

    async def save(self, state: WatchState) -> None:
        self.saved = state


class Feed:
    """What `notify.Inotify.changed` hands the scan: the folders named since the last call."""

    def __init__(self) -> None:
        self.named: set[str] = set()
        self.full = True

    def changed(self) -> frozenset[str] | None:
        if self.full:
            self.full = False
            return None
        out = frozenset(self.named)
        self.named.clear()
        return out


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def watcher(
    store: ObjectStore,
    clock: Clock,
    full_every: timedelta | None,
    state: WatchStateStore | None = None,
) -> Watcher:
    return Watcher(
        store,
        CountingPublisher(),
        clock,
        timedelta(minutes=5),
        state or MemoryState(),
        EmptyRegistry(),
        full_every=full_every,
    )


# -- the tree ------------------------------------------------------------------------------------


@functools.cache
def _template(shards: bool) -> dict[str, Any]:
    entries = (
        (native.Shard(path="rank-0.bin", size=len(SHARD), checksum=cs.of_bytes(SHARD)),)
        if shards
        else ()
    )
    identity = CheckpointIdentity(job_id="job-0", run_id="run-1", created_at=T0)
    doc = native.Manifest(step=0, created_at=T0, identity=identity, shards=entries)
    return doc.model_dump(mode="json")


def manifest(job: str, step: int, shards: bool) -> bytes:
    """The manifest `native.write` (the SDK) writes, for ``job`` at ``step``."""
    doc = _template(shards)
    doc = {**doc, "step": step, "identity": {**doc["identity"], "job_id": job}}
    return json.dumps(doc, indent=2).encode()


def folders(jobs: int, per_job: int) -> Iterator[tuple[str, int]]:
    for j in range(jobs):
        for s in range(per_job):
            yield f"job-{j:05d}/step-{s:08d}", s


def build_fs_tree(root: Path, jobs: int, per_job: int) -> None:
    for folder, step in folders(jobs, per_job):
        path = root / folder
        path.mkdir(parents=True)
        (path / "rank-0.bin").write_bytes(SHARD)
        (path / native.MANIFEST).write_bytes(manifest(folder.split("/")[0], step, shards=True))


def pick(names: list[str], k: int, offset: int) -> list[str]:
    """``k`` distinct folders spread over the root."""
    stride = max(1, len(names) // k)
    return sorted({names[(offset + i * stride) % len(names)] for i in range(k)})


def touch(root: Path, names: list[str], at: float) -> None:
    """A changed listing (newer manifest time), the same checkpoint: read again, no event."""
    for name in names:
        os.utime(root / name / native.MANIFEST, (at, at))


# -- measuring -----------------------------------------------------------------------------------


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of ``obj`` and what it refers to (each object once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, tuple | list | set | frozenset):
        size += sum(deep_size(x, seen) for x in obj)
    elif isinstance(obj, Tracked):
        size += sum(deep_size(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    if hasattr(obj, "__dict__"):
        size += sys.getsizeof(obj.__dict__)
    return size


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def median(xs: list[float]) -> float:
    return statistics.median(xs)


async def bench_fs(jobs: int, per_job: int, rounds: int, redis_url: str | None) -> None:
    n = jobs * per_job
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    clients: list[aioredis.Redis] = []
    base = Path(tempfile.mkdtemp(prefix="bench-watcher-"))
    root = base / "root"
    root.mkdir()
    try:
        started = time.perf_counter()
        build_fs_tree(root, jobs, per_job)
        print(
            f"fs: {n:,} folders ({jobs} jobs x {per_job}), 2 files each, built in "
            f"{time.perf_counter() - started:.0f} s"
        )
        store = FsStore(root)
        names = [f for f, _ in folders(jobs, per_job)]

        # Memory of the first scan, and what is kept after it (tracemalloc slows it: not timed).
        clock = Clock()
        w = watcher(store, clock, timedelta(minutes=5))
        tracemalloc.start()
        await w.scan_once()
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert w.state is not None
        cursor = deep_size(w.cursor.seen)
        state = deep_size(w.state.folders)
        both = deep_size((w.cursor.seen, w.state.folders))
        print(f"fs first scan memory: peak {mib(peak)} (tracemalloc), kept after it {mib(kept)}")
        print(
            f"fs kept per folder: cursor {cursor / n:.0f} B (fingerprint + dict entry + key), "
            f"tracked entry {state / n:.0f} B; both (keys shared) {both / n:.0f} B, "
            f"{mib(both)} at {n:,}"
        )
        del w

        if not rounds:
            return
        first: list[float] = []
        idle_named: list[float] = []
        idle_full: list[float] = []
        every: list[float] = []
        k_named: dict[int, list[float]] = {1: [], 100: []}
        k_full: dict[int, list[float]] = {1: [], 100: []}
        for r in range(rounds):
            clock = Clock()
            feed = Feed()
            state: WatchStateStore | None = None
            if redis_url is not None:  # the watch state in Redis, as the service keeps it
                client = aioredis.from_url(redis_url)
                state = RedisWatchState(client, prefix, f"{store.uri('x')}#{r}")
                clients.append(client)
            w = watcher(store, clock, timedelta(minutes=5), state)
            w.changes = feed
            first.append(await timed(w.scan_once))
            events = w.publisher.count  # type: ignore[attr-defined]
            for _ in range(3):
                clock.now += timedelta(seconds=2)
                idle_named.append(await timed(w.scan_once))
            for k in (1, 100):
                chosen = pick(names, k, r * 1000 + k)
                touch(root, chosen, time.time() + 10 + r * 100 + k)
                feed.named |= set(chosen)
                clock.now += timedelta(seconds=2)
                k_named[k].append(await timed(w.scan_once))
                assert w.last_scan is not None
                assert w.last_scan.read == k, w.last_scan
            # The periodic full listing (every scan, without notifications).
            w.changes = None
            for _ in range(2):
                clock.now += timedelta(seconds=2)
                idle_full.append(await timed(w.scan_once))
            for k in (1, 100):
                chosen = pick(names, k, r * 1000 + 500 + k)
                touch(root, chosen, time.time() + 1000 + r * 100 + k)
                clock.now += timedelta(seconds=2)
                k_full[k].append(await timed(w.scan_once))
                assert w.last_scan is not None
                assert w.last_scan.read == k, w.last_scan
            # Every manifest read on every scan (what a scan did before the cursor).
            w.cursor.reset()
            clock.now += timedelta(seconds=2)
            every.append(await timed(w.scan_once))
            print(
                f"  fs round {r + 1}: first {first[-1]:.1f} s ({events:,} events), idle named "
                f"{ms(idle_named[-1])}, k=1 {ms(k_named[1][-1])}, k=100 {ms(k_named[100][-1])}, "
                f"full idle {ms(idle_full[-1])}, full k=100 {ms(k_full[100][-1])}, "
                f"read-all {every[-1]:.1f} s"
            )
        where = "Redis (RedisWatchState)" if redis_url else "memory"
        print(f"fs watch state kept in {where} for the timed scans")
        print(f"fs first scan (list + read {n:,} manifests): {median(first):.1f} s")
        print(
            f"fs scan, notifications name what changed: idle {ms(median(idle_named))}, "
            f"k=1 {ms(median(k_named[1]))}, k=100 {ms(median(k_named[100]))}"
        )
        print(
            f"fs scan, full listing (periodic safety net; every scan when polling): idle "
            f"{ms(median(idle_full))}, k=1 {ms(median(k_full[1]))}, "
            f"k=100 {ms(median(k_full[100]))}"
        )
        print(f"fs scan reading every manifest (before the cursor): {median(every):.1f} s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for client in clients:
            async for key in client.scan_iter(match=state_keys(prefix)):
                await client.delete(key)
            await client.aclose()


# -- S3 --------------------------------------------------------------------------------------------


def poll_cost(objects: int, poll_s: float) -> tuple[int, float, float]:
    """LIST requests per scan, per minute, and USD per month, for ``objects`` keys."""
    per_scan = max(1, math.ceil(objects / 1000))
    per_minute = per_scan * 60 / poll_s
    usd_month = per_minute * MINUTES_PER_MONTH * LIST_PRICE_PER_1000 / 1000
    return per_scan, per_minute, usd_month


async def bench_s3(n: int, rounds: int, poll_s: float, objects_per_folder: int) -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    calls: list[str] = []
    waited = [0.0]  # seconds spent inside S3 requests (moto's time, not the watcher's)
    sent_at: dict[int, float] = {}

    def before(model: Any, **_: Any) -> None:
        calls.append(model.name)
        sent_at[threading.get_ident()] = time.perf_counter()

    def after(**_: Any) -> None:
        waited[0] += time.perf_counter() - sent_at.pop(threading.get_ident(), time.perf_counter())

    client.meta.events.register("before-call.s3.*", before)
    client.meta.events.register("after-call.s3.*", after)
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    try:
        per_job = 100
        jobs = max(1, n // per_job)
        names = [f for f, _ in folders(jobs, per_job)]
        started = time.perf_counter()

        def put(folder: str) -> None:
            body = manifest(folder.split("/")[0], int(folder.rsplit("-", 1)[1]), shards=False)
            client.put_object(Bucket=bucket, Key=f"ckpt/{folder}/{native.MANIFEST}", Body=body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, names))
        print(
            f"s3: {len(names):,} folders (one manifest each) uploaded to moto in "
            f"{time.perf_counter() - started:.0f} s"
        )
        store = S3Store(bucket, prefix="ckpt", client=client)
        first: list[float] = []
        idle: list[float] = []
        k_times: dict[int, list[float]] = {1: [], 100: []}
        clock = Clock()
        w = watcher(store, clock, timedelta(minutes=5))
        calls.clear()
        first.append(await timed(w.scan_once))  # once: every manifest is one GET from moto
        print(
            f"  s3 first scan {first[-1]:.1f} s (LIST {calls.count('ListObjectsV2')}, GET "
            f"{calls.count('GetObject')})"
        )
        own: list[float] = []
        for r in range(rounds):
            calls.clear()
            clock.now += timedelta(seconds=poll_s)
            waited[0] = 0.0
            idle.append(await timed(w.scan_once))
            own.append(idle[-1] - waited[0])
            idle_calls = (calls.count("ListObjectsV2"), calls.count("GetObject"))
            for k in (1, 100):
                for folder in pick(names, k, r * 500 + k):
                    put(folder)  # a new version of the manifest: new LastModified
                calls.clear()
                clock.now += timedelta(seconds=poll_s)
                k_times[k].append(await timed(w.scan_once))
                assert calls.count("GetObject") == k, calls.count("GetObject")
            print(
                f"  s3 round {r + 1}: idle {ms(idle[-1])} (LIST {idle_calls[0]}, GET "
                f"{idle_calls[1]}), k=1 {ms(k_times[1][-1])}, k=100 {ms(k_times[100][-1])}"
            )
        m = len(names)
        print(
            f"s3 at {m:,} folders: first scan {median(first):.1f} s, idle scan "
            f"{ms(median(idle))} ({math.ceil(m / 1000)} LIST, 0 GET), k=1 "
            f"{ms(median(k_times[1]))} (1 GET), k=100 {ms(median(k_times[100]))} (100 GET)"
        )
        if m < 100_000:
            f = 100_000 / m
            print(
                f"s3 at 100,000 folders, EXTRAPOLATED x{f:g} from {m:,}: an idle scan sends "
                f"{math.ceil(100_000 / 1000)} LIST and no GET; the watcher's own work in it "
                f"(outside the requests and their parsing) ≈ {median(own) * f:.2f} s (measured "
                f"{ms(median(own))} at {m:,}); the rest is the requests' latency "
                f"(moto here: {(median(idle) - median(own)) / math.ceil(m / 1000) * 1000:.0f} "
                f"ms per LIST at {m:,} keys; moto's listing grows with the bucket, so its "
                f"time is not extrapolated)"
            )
    finally:
        server.stop()
    for objects_each in sorted({1, objects_per_folder}):
        objects = 100_000 * objects_each
        per_scan, per_minute, usd = poll_cost(objects, poll_s)
        print(
            f"s3 poll cost at 100,000 folders x {objects_each} object(s) = {objects:,} keys, "
            f"poll every {poll_s:g} s: {per_scan} LIST per scan, {per_minute:,.0f} LIST per "
            f"minute, ≈ ${usd:,.0f}/month at ${LIST_PRICE_PER_1000}/1000 LIST "
            f"(GET: only the folders that changed)"
        )


def main() -> None:
    default_poll = WriterWatcherSettings.model_fields["poll_interval_s"].default
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--per-job", type=int, default=100)
    p.add_argument("--s3-folders", type=int, default=10_000)
    p.add_argument("--poll-s", type=float, default=default_poll)
    p.add_argument(
        "--objects-per-folder",
        type=int,
        default=9,
        help="for the poll-cost line: e.g. 8 shards + manifest",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--skip-fs", action="store_true")
    p.add_argument("--redis", help="keep the timed scans' watch state in this Redis (URL)")
    args = p.parse_args()
    bounded.configure(timeout_s=600)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    with contextlib.suppress(OSError):
        print(
            f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs"
        )
    if not args.skip_fs:
        asyncio.run(bench_fs(args.jobs, args.per_job, args.rounds, args.redis))
    if not args.skip_s3:
        asyncio.run(bench_s3(args.s3_folders, args.rounds, args.poll_s, args.objects_per_folder))


if __name__ == "__main__":
    main()
