"""CPU time of `formats.verify` on one TINY native checkpoint (a manifest and one 64-byte shard):
the fixed cost of a verification, which is what the integrity-checker pays per commit of such a
checkpoint (`bench_consume_services.py --service checker`), apart from any byte it reads.

Writes N checkpoints under a temp storage root (``job-<i % 50>/step-<i>``), verifies each once to
warm up, then ``--rounds`` times verifies all of them on this one thread, printing the CPU and
wall time per checkpoint. ``--profile`` adds a cProfile summary of one more pass. Usage:
    .venv/bin/python bench/bench_verify_tiny.py [--checkpoints 2000] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
import time
from datetime import UTC, datetime

from ckpt_ha.formats import native, verify
from ckpt_ha.storage import FsStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ckpt-bench-tiny-")
    try:
        store = FsStore(root)
        now = datetime.now(UTC)
        keys = [f"job-{i % 50}/step-{i}" for i in range(args.checkpoints)]
        for i, key in enumerate(keys):
            native.write(store, key, {"rank-0.bin": bytes(64)}, step=i, created_at=now)
        for key in keys:  # warm up; every one must be valid
            report = verify(store, key, "xxh3_64")
            assert report.ok, report.reasons
        for r in range(1, args.rounds + 1):
            cpu, wall = time.process_time(), time.perf_counter()
            for key in keys:
                verify(store, key, "xxh3_64")
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(
                f"round {r}: verify of a tiny checkpoint: CPU {cpu / len(keys) * 1e6:.0f} µs, "
                f"wall {wall / len(keys) * 1e6:.0f} µs ({len(keys)} checkpoints)"
            )
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for key in keys:
                verify(store, key, "xxh3_64")
            profile.disable()
            pstats.Stats(profile).strip_dirs().sort_stats("cumulative").print_stats(30)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
