"""Redis memory of the registry before and after tombstones leave it for the archive (issue 33:
tombstones kept, index bounded).

The history of `bench_rebuild` (many jobs, each checkpoint written, committed, verified and
registered; a job keeps its last ``--keep``, older ones are expired and deleted: tombstones),
spread over ``--days`` days, is projected into the registry by the registrar's own projection
(`Registry.apply_many`), under a private key prefix of the machine's Redis. The memory of that
prefix is the sum of ``MEMORY USAGE`` over its keys (other users of the same Redis do not count).
Then the retention-janitor's step (`Janitor.move_cold_tombstones`) moves the tombstones older
than ``--hot-days`` to a filesystem archive, and the memory is measured again. Printed per
checkpoint and scaled to 1,000,000 checkpoints (the memory of these keys is linear in their
number), with the archive's size on disk.

Usage (from the checkout, whose root must be on the path: the history is `bench_rebuild`'s and
the janitor's other ports the tests' in-memory fakes):
    PYTHONPATH=. .venv/bin/python bench/bench_tombstones.py \
        [--checkpoints 20000] [--jobs 200] [--keep 10] [--days 30] [--hot-days 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.bench_rebuild import EVENTS_PER_CHECKPOINT, history
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.registry.client import connect
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor.archive import open_archive
from ckpt_ha.retention_janitor.handlers import Janitor
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.storage import FsStore
from ckpt_ha.telemetry.metrics import ServiceMetrics
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.resumes import InMemoryResumes, SettableFeed

BATCH = 500
PER = 1_000_000


async def memory(registry: Registry) -> tuple[int, int]:
    """(bytes, keys) under the registry's prefix, by ``MEMORY USAGE`` of each key."""
    total = keys = 0
    batch: list[str] = []

    async def flush() -> int:
        async with registry.r.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.memory_usage(key, samples=0)
            sizes = await pipe.execute()
        batch.clear()
        return sum(s or 0 for s in sizes)

    async for key in registry.r.scan_iter(match=registry.keys.everything, count=1000):
        batch.append(key)
        keys += 1
        if len(batch) == 1000:
            total += await flush()
    if batch:
        total += await flush()
    return total, keys


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def run(args: argparse.Namespace) -> None:
    prefix = f"bench-tomb-{secrets.token_hex(4)}"
    registry = Registry(connect(args.redis_url), prefix)
    tmp = Path(tempfile.mkdtemp(prefix="bench-tombstones-"))
    events = args.checkpoints * EVENTS_PER_CHECKPOINT
    gen = argparse.Namespace(
        events=events, jobs=args.jobs, keep=args.keep, run_every=10**9, days=args.days
    )
    try:
        t0 = time.perf_counter()
        batch = []
        for event in history(gen, "/data"):
            if not event.data.EVENT_TYPE.startswith("checkpoint."):
                continue
            batch.append(event)
            if len(batch) == BATCH:
                await registry.apply_many(batch)
                batch.clear()
        if batch:
            await registry.apply_many(batch)
        built = time.perf_counter() - t0
        records = len(await registry.r.keys(registry.keys.checkpoint("*")))
        tombs = len(await registry.by_state(CheckpointState.DELETED))
        before, keys_before = await memory(registry)

        archive = open_archive(str(tmp / "archive"), create=True)
        janitor = Janitor(
            registry, InMemoryResumes(), SettableFeed(), FsStore(tmp), RecordingPublisher(),
            lambda: datetime.now(UTC), RetentionMetrics(ServiceMetrics("bench")),
            archive=archive, hot=timedelta(days=args.hot_days),
        )  # fmt: skip
        t1 = time.perf_counter()
        moved = await janitor.move_cold_tombstones()
        took = time.perf_counter() - t1
        after, keys_after = await memory(registry)
        on_disk = du(tmp / "archive")

        def per(b: int) -> str:
            return f"{b / records:,.0f} B/checkpoint = {b / records * PER / 2**20:,.0f} MB per 1M"

        print(
            f"history: {records} checkpoints of {args.jobs} jobs over {args.days:g} days "
            f"(keep {args.keep}: {tombs} tombstones), projected in {built:.1f} s"
        )
        print(f"before: {before / 2**20:.1f} MB in {keys_before} keys; {per(before)}")
        print(
            f"after moving {len(moved)} tombstones older than {args.hot_days:g} days "
            f"(in {took:.1f} s = {len(moved) / max(took, 1e-9):,.0f}/s): "
            f"{after / 2**20:.1f} MB in {keys_after} keys; {per(after)}"
        )
        print(
            f"archive: {on_disk / 2**20:.1f} MB on disk for {len(moved)} tombstones "
            f"({on_disk / max(len(moved), 1):,.0f} B each, two objects each)"
        )
    finally:
        async for key in registry.r.scan_iter(match=registry.keys.everything, count=1000):
            await registry.r.delete(key)
        await registry.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", type=int, default=20_000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--keep", type=int, default=10, help="checkpoints a job keeps")
    ap.add_argument("--days", type=float, default=30.0, help="how long the history spans")
    ap.add_argument("--hot-days", type=float, default=7.0, help="CKPT_HA_TOMBSTONE_HOT_DAYS")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
