"""DCP through ckpt-ha against plain PyTorch DCP, on the same state dict in the same run.

One process, no process group (DCP's single-process mode), a state dict of N MB of float32
tensors (default 300 MB), folders under a temporary directory on the disk:

1. save throughput: ``ckpt_ha.sdk.dcp.save`` (intent, DCP save with every file checksummed as
   it is written, fsync, commit) against plain ``torch.distributed.checkpoint.save`` (same
   ``FileSystemWriter``, fsync on); ``--rounds`` alternating rounds, median and best
   (target ratio >= 0.9);
2. training-step stall with ``ckpt_ha.sdk.dcp.async_save``: how long the call blocks the
   training loop (intent + staging the state to CPU memory; the first save also allocates the
   staging copy, later ones reuse it), as a share of the synchronous save's time
   (target <= 10%); and how much longer the training steps run while the write finishes. The
   step runs on one thread, standing in for a GPU step that leaves the CPU to the writer;
3. ``ckpt-ha verify`` (`formats.verify_path`: restricted ``.metadata``, sizes, checksums,
   "bytes" items) on one of the DCP checkpoints against a raw read of its files, both from the
   page cache (target ratio >= 0.8).

No bus: nothing is announced. Usage:
    .venv/bin/python bench/bench_dcp.py [--mb 300] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import mmap
import shutil
import statistics
import tempfile
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ckpt_ha.formats import verify_path
from ckpt_ha.sdk import dcp

CHUNK = 1024 * 1024  # dd bs=1M


def state_dict(mb: int) -> dict[str, Any]:
    """Layers of 1024 x 1024 float32 (4 MiB each) plus a step: what a model save looks like."""
    torch.manual_seed(0)
    layers = max(1, mb * 2**20 // (4 * 2**20))
    model = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(layers)}
    return {"model": model, "step": 1}


def plain_save(state: dict[str, Any], folder: Path) -> float:
    started = time.perf_counter()
    dcp_save(state, storage_writer=FileSystemWriter(folder), no_dist=True)
    return time.perf_counter() - started


def ckpt_ha_save(state: dict[str, Any], root: Path, step: int) -> float:
    started = time.perf_counter()
    dcp.save(state, step=step, job_id="bench", storage_root=str(root), run_id="bench")
    return time.perf_counter() - started


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".distcp")


def raw_read(folder: Path) -> int:
    buf = mmap.mmap(-1, CHUNK)  # page-aligned
    view = memoryview(buf)
    total = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    view.release()
    buf.close()
    return total


def training_step(x: torch.Tensor, w: torch.Tensor) -> float:
    """A fixed amount of compute (matmuls), timed."""
    started = time.perf_counter()
    for _ in range(4):
        x = torch.tanh(x @ w)
    return time.perf_counter() - started


def stall(state: dict[str, Any], root: Path, step: int) -> tuple[float, float, float, int]:
    """(async_save call, extra step time while in flight, steady step, steps in flight)."""
    x, w = torch.randn(256, 1024), torch.randn(1024, 1024) / 32
    steady = statistics.median(training_step(x, w) for _ in range(20))
    started = time.perf_counter()
    handle = dcp.async_save(state, step=step, job_id="bench", storage_root=str(root),
                            run_id="bench")  # fmt: skip
    blocked = time.perf_counter() - started
    in_flight = []
    while not handle.done():
        in_flight.append(training_step(x, w))
    handle.result()
    extra = sum(in_flight) - steady * len(in_flight)
    return blocked, max(0.0, extra), steady, len(in_flight)


def plain_async_blocking(state: dict[str, Any], base: Path) -> float:
    """How long plain ``dcp.async_save`` blocks with a reused stager (its second save)."""
    stager = DefaultStager(StagingOptions(False, False, False, False))
    blocked = 0.0
    for n in range(2):
        started = time.perf_counter()
        upload = dcp_async_save(
            state, storage_writer=FileSystemWriter(base / f"plain-async-{n}"), async_stager=stager
        )
        blocked = time.perf_counter() - started
        cast(Future[Any], upload).result()
    stager.close()
    return blocked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-dcp-", dir=args.dir))
    try:
        state = state_dict(args.mb)
        plain_save(state, base / "warm-up")  # first-use costs (imports, allocations) for neither
        gb = folder_bytes(base / "warm-up") / 1e9
        shutil.rmtree(base / "warm-up")
        plain_times, ours_times = [], []
        for round_ in range(args.rounds):  # alternating which goes first
            plain = base / f"plain-{round_}"
            if round_ % 2:
                ours_times.append(ckpt_ha_save(state, base, round_ + 1))
                plain_times.append(plain_save(state, plain))
            else:
                plain_times.append(plain_save(state, plain))
                ours_times.append(ckpt_ha_save(state, base, round_ + 1))
            shutil.rmtree(plain)
        plain_s, ours_s = statistics.median(plain_times), statistics.median(ours_times)
        print(f"state dict: {gb:.3f} GB of float32 tensors, one process, fsync on")
        print(f"plain dcp.save:        {gb / plain_s:6.2f} GB/s  (median {plain_s:.3f} s)")
        print(f"ckpt_ha.sdk.dcp.save:  {gb / ours_s:6.2f} GB/s  (median {ours_s:.3f} s)")
        print(
            f"throughput ratio ckpt-ha/plain: median {plain_s / ours_s:.2f}, best "
            f"{min(plain_times) / min(ours_times):.2f}  (target >= 0.9)"
        )

        torch.set_num_threads(1)
        plain_blocked = plain_async_blocking(state, base)
        for label, step in (("first", args.rounds + 1), ("next", args.rounds + 2)):
            blocked, extra, steady, steps = stall(state, base, step)
            print(
                f"async_save ({label}): blocks training {blocked:.3f} s = {blocked / ours_s:.1%} "
                f"of a synchronous save (target <= 10%); plain dcp.async_save with the same "
                f"reused stager blocks {plain_blocked:.3f} s"
            )
            print(
                f"  {steps} steps of ~{steady * 1000:.0f} ms ran during the write, "
                f"{extra:.3f} s slower in total ({extra / ours_s:.1%} of a synchronous save)"
            )

        folder = base / "bench" / f"step-{args.rounds:08d}"
        total = raw_read(folder)  # warm the page cache for both
        best_raw = best_verify = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            raw_read(folder)
            best_raw = min(best_raw, time.perf_counter() - t)
            t = time.perf_counter()
            report = verify_path(folder)
            best_verify = min(best_verify, time.perf_counter() - t)
            assert report.ok, report.reasons
        read_gb = total / 1e9
        print(f"raw read of the checkpoint's files:      {read_gb / best_raw:6.2f} GB/s")
        print(f"ckpt-ha verify (DCP checks + checksums): {read_gb / best_verify:6.2f} GB/s")
        print(f"ratio verify/raw: {best_raw / best_verify:.2f}  (target >= 0.8)")
    finally:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
