"""The scrub's read budget: does a real scrub round hold the rate it is given?

Writes valid native checkpoints on a filesystem root (default 2 GiB in a temporary directory on
the disk, not tmpfs), records them valid in an in-process registry, then runs the real
`Scrubber.scrub_once` (verification on the storage worker threads, reads through `ReadBudget`)
at each budget. Before every run the files are dropped from the page cache
(``posix_fadvise(DONTNEED)`` after an ``fsync``), so every byte comes from the device, and the
device-level bytes the process read (``/proc/self/io`` ``read_bytes``) are printed beside what
the scrub read: the rate the scrub imposes on storage, and the unlimited rate for comparison.

Printed per run: bytes the scrub read, wall seconds, achieved MiB/s against the budget, the
device read rate, the largest excess of bytes read over ``budget * t`` at any sampled instant
(must stay within the burst), and the highest rate over any 1 s window.

    PYTHONPATH=services:contracts:. python bench/bench_scrub.py [--total-mib 2048] \\
        [--budgets 50,200,0] [--burst-mib 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native, verify
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.integrity_checker.metrics import ScrubMetrics
from ckpt_ha.integrity_checker.scrub import Scrubber
from ckpt_ha.storage import FsStore
from ckpt_ha.storage.read_budget import ReadBudget
from ckpt_ha.telemetry.metrics import ServiceMetrics

MIB = 2**20
SHARD = 64 * MIB
T0 = datetime(2026, 12, 1, tzinfo=UTC)


class Registry:
    """The two reads the scrub makes of the registry, over records held here."""

    def __init__(self, records: list[CheckpointRecord]) -> None:
        self.records = {r.checkpoint_id: r for r in records}

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        return [r for r in self.records.values() if r.state is state]

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        return self.records.get(checkpoint_id)


class Publisher:
    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        raise AssertionError(f"the scrub found an intact checkpoint corrupt: {event}")


def write_checkpoints(
    store: FsStore, total_mib: int, per_checkpoint: int
) -> list[CheckpointRecord]:
    shards = max(1, total_mib * MIB // SHARD)
    block = os.urandom(SHARD)
    records = []
    for c in range(0, shards, per_checkpoint):
        folder = f"job-{c % 3}/step-{c}"
        data = {
            f"rank-{i}.bin": i.to_bytes(8, "little") + block[8:]
            for i in range(c, min(c + per_checkpoint, shards))
        }
        native.write(store, folder, data, step=c, created_at=T0)
        report = verify(store, folder)
        assert report.ok, report
        size = sum(info.size for info in store.list(f"{folder}/"))
        records.append(
            CheckpointRecord(
                checkpoint_id=checkpoint_id_on(store, folder),
                job_id=folder.split("/")[0],
                uri=store.uri(folder),
                state=CheckpointState.VALID,
                checksums=report.checksums,
                total_bytes=size,
                created_at=T0,
                updated_at=T0,
            )
        )
    return records


def files(root: Path) -> Iterator[Path]:
    return (p for p in root.rglob("*") if p.is_file())


def drop_cache(root: Path) -> None:
    """Evict every file under ``root`` from the page cache, so the scrub reads the device."""
    for path in files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def device_read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


async def run_once(
    store: FsStore, records: list[CheckpointRecord], budget_mib: float, burst_mib: float
) -> dict[str, float]:
    metrics = ScrubMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))
    budget = ReadBudget(
        budget_mib * MIB, int(burst_mib * MIB), on_read=metrics.read, on_wait=metrics.waited
    )
    scrub = Scrubber(store, Registry(records), Publisher(), lambda: datetime.now(UTC), "xxh3_64",
                     metrics, budget)  # fmt: skip
    samples: list[tuple[float, int]] = []

    async def sample() -> None:
        while True:
            samples.append((time.monotonic(), budget.bytes_read))
            await asyncio.sleep(0.05)

    disk0 = device_read_bytes()
    start = time.monotonic()
    sampler = asyncio.create_task(sample())
    result = await scrub.scrub_once()
    seconds = time.monotonic() - start
    sampler.cancel()
    samples.append((time.monotonic(), budget.bytes_read))
    assert result.complete, result
    assert result.scrubbed == len(records), result
    disk = device_read_bytes() - disk0
    rate = budget_mib * MIB
    excess = max((b - rate * (t - start) for t, b in samples), default=0.0) if rate else 0.0
    window = 0.0  # the most read in any span of at least 1 s between two samples, per second
    for i, (t, b) in enumerate(samples):
        t2, b2 = next(((t2, b2) for t2, b2 in samples[i:] if t2 - t >= 1.0), (t, b))
        if t2 > t:
            window = max(window, (b2 - b) / (t2 - t))
    return {
        "bytes": budget.bytes_read,
        "seconds": seconds,
        "rate": budget.bytes_read / seconds,
        "disk_rate": disk / seconds,
        "excess": excess,
        "window": window,
        "waited": budget.waited_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=2048)
    parser.add_argument("--per-checkpoint", type=int, default=4, help="64 MiB shards each")
    parser.add_argument("--budgets", default="50,200,0", help="MiB/s, 0 = unlimited")
    parser.add_argument("--burst-mib", type=float, default=8.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-scrub-") as tmp:
        root = Path(tmp)
        store = FsStore(root)
        records = write_checkpoints(store, args.total_mib, args.per_checkpoint)
        size = sum(p.stat().st_size for p in files(root))
        print(f"{len(records)} valid checkpoints, {size / MIB:.0f} MiB on {root} "
              f"(burst {args.burst_mib:g} MiB, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f})")  # fmt: skip
        medians: dict[float, list[dict[str, float]]] = {b: [] for b in budgets}
        for run in range(args.repeat):
            for budget in budgets:
                drop_cache(root)
                got = asyncio.run(run_once(store, records, budget, args.burst_mib))
                medians[budget].append(got)
                limit = f"{budget:g} MiB/s" if budget else "unlimited"
                window = f"{got['window'] / MIB:7.1f} MiB/s" if got["window"] else "n/a (<1 s)"
                check = ""
                if budget:
                    ok = got["bytes"] <= budget * MIB * got["seconds"] + args.burst_mib * MIB
                    check = (f"  max excess over budget*t {got['excess'] / MIB:5.2f} MiB "
                             f"(burst {args.burst_mib:g})  within budget+burst: {ok}")  # fmt: skip
                print(f"run {run + 1} budget {limit:>11}: {got['bytes'] / MIB:6.0f} MiB in "
                      f"{got['seconds']:6.2f} s = {got['rate'] / MIB:7.1f} MiB/s "
                      f"(device {got['disk_rate'] / MIB:7.1f} MiB/s, best 1 s window {window}, "
                      f"throttled {got['waited']:5.1f} s)"
                      f"{check}")  # fmt: skip
        print("median over runs:")
        for budget, runs in medians.items():
            limit = f"{budget:g} MiB/s" if budget else "unlimited"
            rate = statistics.median(r["rate"] for r in runs) / MIB
            disk = statistics.median(r["disk_rate"] for r in runs) / MIB
            print(f"  budget {limit:>11}: scrub read {rate:7.1f} MiB/s, device {disk:7.1f} MiB/s")


if __name__ == "__main__":
    main()
