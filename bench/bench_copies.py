"""Copies of checkpoints (issue 29): copy throughput against a raw copy of the same bytes, the
copy budget held, and the time a restore from a copy adds.

Writes native checkpoints on a filesystem root (default 256 MiB in shards of 32 MiB, in a
temporary directory on the disk), records them valid in an in-process registry on the
``critical`` tier, and copies them with the real `Replicator.copy_once` to a second filesystem
root and to S3 (moto's server, in-process). Each figure is measured side by side in one run:

* raw: the same files copied by the plainest means (``shutil.copyfile`` to the filesystem,
  boto3's ``upload_file`` to S3), no verification;
* transfer: `storage.transfer.copy_folder` as the copier runs it (pieces of 1 MiB through the
  read budget, unlimited), no verification: the ratio to raw is the copy's own overhead;
* copy round: `Replicator.copy_once` (transfer, then the copy verified on the replica against the
  recorded checksums): every byte is read twice, so about half the raw rate is the ceiling;
* budget: a copy round at ``--budget-mib`` MiB/s: achieved read rate and the largest excess of
  bytes read over ``budget x t`` at any sampled instant (must stay within the burst);
* restore: `sdk.load` of the newest checkpoint from the primary against from each copy.

    PYTHONPATH=services:contracts:. python bench/bench_copies.py [--total-mib 256] \\
        [--shard-mib 32] [--budget-mib 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import numpy as np
from moto.server import ThreadedMotoServer
from prometheus_client import CollectorRegistry

from ckpt_ha import sdk
from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import TIERS, TierChoice
from ckpt_ha.formats import verify
from ckpt_ha.formats.identity import checkpoint_id_on
from ckpt_ha.integrity_checker.metrics import CopyMetrics
from ckpt_ha.integrity_checker.replication import Replicator
from ckpt_ha.storage import FsStore, ObjectStore, S3Store, key_for_uri
from ckpt_ha.storage.read_budget import BudgetedStore, ReadBudget
from ckpt_ha.storage.transfer import copy_folder
from ckpt_ha.telemetry.metrics import ServiceMetrics

MIB = 2**20
T0 = datetime(2026, 12, 3, tzinfo=UTC)
JOB = "bench-copies"


class Registry:
    """The reads the copier makes of the registry, over records held here; what it publishes is
    applied to them as the registrar would (only the copies' state matters here)."""

    def __init__(self, records: list[CheckpointRecord]) -> None:
        self.records = {r.checkpoint_id: r for r in records}

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]:
        return [r for r in self.records.values() if r.state is state]

    async def get(self, checkpoint_id: str) -> CheckpointRecord | None:
        return self.records.get(checkpoint_id)

    async def tier_of(self, job_id: str) -> TierChoice:
        return TierChoice(TIERS["critical"], "chosen", "bench")

    def forget_copies(self) -> None:
        self.records = {k: r.model_copy(update={"copies": {}}) for k, r in self.records.items()}


class Publisher:
    def __init__(self) -> None:
        self.events: list[Envelope[EventData]] = []

    async def publish(self, event: Envelope[EventData]) -> Envelope[EventData]:
        self.events.append(event)
        return event


def write(root: Path, total_mib: int, shard_mib: int) -> list[CheckpointRecord]:
    """Checkpoints as the SDK saves them (``shard_mib`` arrays, 4 per checkpoint)."""
    store = FsStore(root)
    records = []
    per_ckpt = max(shard_mib, min(total_mib, 4 * shard_mib))
    rng = np.random.default_rng(0)
    for n in range(max(1, total_mib // per_ckpt)):
        state = {
            f"w{i}": rng.standard_normal(shard_mib * MIB // 8) for i in range(per_ckpt // shard_mib)
        }
        saved = sdk.save(store, JOB, n, state, run_id="bench")
        folder = key_for_uri(store, saved.uri)
        assert folder is not None
        report = verify(store, folder)
        assert report.ok, report
        records.append(
            CheckpointRecord(
                checkpoint_id=checkpoint_id_on(store, folder), job_id=JOB, step=n,
                uri=saved.uri, state=CheckpointState.VALID, checksums=report.checksums,
                total_bytes=sum(i.size for i in store.list(f"{folder}/")), created_at=T0,
                updated_at=T0,
            )
        )  # fmt: skip
    return records


def drop_cache(root: Path) -> None:
    """Every file under ``root`` out of the page cache, so reads come from the device."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def raw_copy(src: Path, target: Any, *, durable: bool = False) -> None:
    """The plainest copy of every file; ``durable``: each file fsynced before the next (what the
    filesystem backend's atomic publish does for every object)."""
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        if isinstance(target, Path):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / rel)
            if durable:
                fd = os.open(target / rel, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        else:
            client, bucket, prefix = target
            client.upload_file(str(path), bucket, f"{prefix}/{rel}")


def clear(target: ObjectStore) -> None:
    for info in list(target.list()):
        target.delete(info.key)


class Sampler:
    """Samples a budget's bytes read every 50 ms: the largest excess over ``rate x t``."""

    def __init__(self, budget: ReadBudget, rate: float) -> None:
        self.budget, self.rate, self.excess = budget, rate, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            t = time.monotonic() - self.start
            self.excess = max(self.excess, self.budget.bytes_read - self.rate * t)


def replicator(primary: FsStore, registry: Registry, replica: ObjectStore,
               budget: ReadBudget) -> Replicator:  # fmt: skip
    metrics = CopyMetrics(ServiceMetrics("integrity-checker", CollectorRegistry()))
    return Replicator(primary, registry, Publisher(), lambda: T0, "xxh3_64",  # type: ignore[arg-type]
                      metrics, {"critical": "bench://replica"}, budget,
                      replicas={"bench://replica": replica})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--shard-mib", type=int, default=32)
    ap.add_argument("--budget-mib", type=float, default=64.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench")  # fmt: skip
    client.create_bucket(Bucket="copies")
    base = Path(
        tempfile.mkdtemp(prefix="bench-copies-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    )
    try:
        (base / "primary").mkdir()
        records = write(base / "primary", args.total_mib, args.shard_mib)
        total = sum(r.total_bytes or 0 for r in records)
        primary = FsStore(base / "primary")
        registry = Registry(records)
        targets: dict[str, tuple[ObjectStore, Any]] = {
            "fs": (FsStore(base / "replica"), base / "raw"),
            "s3": (S3Store("copies", "copy", client=client), (client, "copies", "raw")),
        }
        (base / "replica").mkdir()
        print(f"{total / MIB:.0f} MiB in {len(records)} checkpoints; load {os.getloadavg()[0]:.2f}")
        for name, (replica, raw_target) in targets.items():
            rows: dict[str, list[float]] = {"raw": [], "transfer": [], "copy round": []}
            if name == "fs":
                rows = {"raw": [], "raw+fsync": [], **rows}
            for _ in range(args.repeat):
                drop_cache(base / "primary")
                t = time.monotonic()
                raw_copy(base / "primary", raw_target)
                rows["raw"].append(total / (time.monotonic() - t))
                if name == "fs":
                    drop_cache(base / "primary")
                    t = time.monotonic()
                    raw_copy(base / "primary", raw_target, durable=True)
                    rows["raw+fsync"].append(total / (time.monotonic() - t))
                clear(replica)
                drop_cache(base / "primary")
                reads = BudgetedStore(primary, ReadBudget(0))
                t = time.monotonic()
                for r in records:
                    folder = key_for_uri(primary, r.uri)
                    assert folder is not None
                    copy_folder(reads, replica, folder)
                rows["transfer"].append(total / (time.monotonic() - t))
                clear(replica)
                registry.forget_copies()
                drop_cache(base / "primary")
                rep = replicator(primary, registry, replica, ReadBudget(0))
                t = time.monotonic()
                done = asyncio.run(rep.copy_once())
                rows["copy round"].append(total / (time.monotonic() - t))
                assert done.copied == len(records), done
            raw = statistics.median(rows["raw"])
            durable = statistics.median(rows.get("raw+fsync", rows["raw"]))
            for label, rates in rows.items():
                med = statistics.median(rates)
                each = ", ".join(f"{x / MIB:.0f}" for x in rates)
                print(f"FS -> {name.upper()} {label:10s}: median {med / MIB:7.1f} MiB/s ({each}); "
                      f"{med / raw:.2f}x raw, {med / durable:.2f}x raw+fsync")  # fmt: skip
            # The budget held by a copy round (reads of the primary and of the copy's check).
            clear(replica)
            registry.forget_copies()
            drop_cache(base / "primary")
            rate = args.budget_mib * MIB
            budget = ReadBudget(rate, 8 * MIB)
            rep = replicator(primary, registry, replica, budget)
            with Sampler(budget, rate) as sampler:
                t = time.monotonic()
                asyncio.run(rep.copy_once())
                took = time.monotonic() - t
            read = budget.bytes_read
            print(f"FS -> {name.upper()} budget {args.budget_mib:g} MiB/s: read {read / MIB:.0f} "
                  f"MiB at {read / took / MIB:.1f} MiB/s; largest excess over budget x t "
                  f"{sampler.excess / MIB:.1f} MiB (burst 8 MiB)")  # fmt: skip
            # What a restore from the copy adds: load the newest checkpoint from each side.
            newest = key_for_uri(primary, records[-1].uri)
            assert newest is not None
            timings: dict[str, list[float]] = {"primary": [], "copy": []}
            for _ in range(args.repeat):
                for side, store in (("primary", primary), ("copy", replica)):
                    drop_cache(base / "primary")
                    drop_cache(base / "replica")
                    t = time.monotonic()
                    sdk.load(store, newest, tensors="numpy")
                    timings[side].append(time.monotonic() - t)
            p, c = statistics.median(timings["primary"]), statistics.median(timings["copy"])
            size = (records[-1].total_bytes or 0) / MIB
            print(f"restore of {size:.0f} MiB from the primary {p:.2f} s, from the {name.upper()} "
                  f"copy {c:.2f} s: {c - p:+.2f} s")  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
