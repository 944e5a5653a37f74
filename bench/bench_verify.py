"""`ckpt-ha verify` rate against a raw read of the same files, in the same run.

Writes a native checkpoint of N shards (default 2 GiB in 16 shards), then, with the files in the
page cache for both, reads every shard raw (into one reused page-aligned buffer, the way `dd
bs=1M of=/dev/null` does) and verifies the checkpoint (sizes + checksums). Prints both rates and
the ratio. Usage:
    .venv/bin/python bench/bench_verify.py [--gib 2] [--shards 16] [--checksum xxh3_64|sha256]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from ckpt_ha.formats import native, verify_path
from ckpt_ha.storage import FsStore

CHUNK = 1024 * 1024  # dd bs=1M


def raw_read(folder: Path) -> int:
    buf = mmap.mmap(-1, CHUNK)  # page-aligned
    view = memoryview(buf)
    total = 0
    for path in sorted(folder.glob("*.bin")):
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    view.release()
    buf.close()
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--checksum", default="xxh3_64", choices=["xxh3_64", "sha256"])
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        folder = base / "step-1"
        folder.mkdir()
        shard_bytes = int(args.gib * 2**30) // args.shards
        block = os.urandom(1 << 20)
        shards = {f"rank-{i:02d}.bin": block * (shard_bytes >> 20) for i in range(args.shards)}
        native.write(
            FsStore(folder), "", shards, step=1, created_at=datetime.now(UTC),
            algorithm=args.checksum,
        )  # fmt: skip
        del shards
        total = raw_read(folder)  # warm the page cache for both
        best_raw = best_verify = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            raw_read(folder)
            best_raw = min(best_raw, time.perf_counter() - t)
            t = time.perf_counter()
            report = verify_path(folder, args.checksum)
            best_verify = min(best_verify, time.perf_counter() - t)
            assert report.ok, report.reasons
        gb = total / 1e9
        print(f"checkpoint: {gb:.2f} GB in {args.shards} shards, checksum {args.checksum}")
        print(f"raw read (page-aligned 1 MiB readinto): {gb / best_raw:6.2f} GB/s")
        print(f"ckpt-ha verify (sizes + checksums):     {gb / best_verify:6.2f} GB/s")
        print(f"ratio verify/raw: {best_raw / best_verify:.2f}  (target >= 0.8)")
    finally:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
