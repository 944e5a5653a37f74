"""What ckpt-ha costs a training job, side by side with what the job would do without it, in one
run: for each state size (default 300 MB and 2 GB), page cache warm and (when root) cold.

Rows (each a ratio, higher is better, with its target):

* the machine: raw write (``os.write`` of 4 MiB blocks, one file per 4 MiB tensor, ``fsync``
  each) and raw read (page-aligned 1 MiB ``readinto``) of the same bytes, warm and cold;
* DCP save: plain ``dcp.save`` (``FileSystemWriter``, fsync on) time / ``ckpt_ha.sdk.dcp.save``
  time, on the same state, alternating which goes first (target >= 0.95);
* native save: writing the same files with ``os.write`` + ``fsync`` / ``ckpt_ha.sdk.save``
  (target >= 0.9);
* ``async_save`` stall: the time the call blocks the loop, as a share of a synchronous save:
  plain ``dcp.async_save`` with a stager that already holds its copy, ckpt-ha's first save after
  ``dcp.prepare_async`` and its later saves (target: first within 2 points of plain, later
  <= 5%), with the CPU time the calling thread spent in the call beside it: the stall is the
  staging copy, CPU-bound, while a synchronous save waits on the disk, so on a saturated
  machine the share grows with the load for plain DCP and ckpt-ha alike (the CPU time does
  not);
* verify: a raw read of a checkpoint's files / ``ckpt-ha verify`` (``formats.verify_path``) of
  it, warm, and cold when root (target >= 0.9): the DCP checkpoint of the save rows, and a
  Trainer checkpoint (``CkptHaCallback``'s, of about the same size);

* restore: a raw read of a committed DCP checkpoint plus plain ``dcp.load`` of it /
  ``dcp.resume`` of it (verification included), warm (target >= 0.85);
* Trainer save: a GPT-2 Trainer (from a config, no weights downloaded) of about the same size,
  its save without / with ``CkptHaCallback``, from the Trainer's decision to save to the end of
  ``on_save``: what the training loop waits for (the callback's commit then runs beside
  training; target >= 0.95);
* Trainer restore: a raw read of its checkpoint plus ``trainer.train(resume_from_checkpoint=)``
  / ``hf.train`` with a plan for it (target >= 0.85). The restore and Trainer rows are in
  ``overhead_restore.py``.

The machine is shared: every ratio comes from rounds of both sides taken in turn in this one
process, with the median of the rounds; the load average is printed. Cold-cache rows drop the
page cache (``/proc/sys/vm/drop_caches``, root only) before each read, which slows everyone
else on the machine for a moment. Usage:

    PYTHONPATH=services:contracts:. .venv/bin/python bench/bench_overhead.py \\
        [--mb 300 2000] [--rounds 3] [--no-cold] [--dir DIR] [--only verify ...]

``--only`` runs some of the rows (`SECTIONS`), e.g. ``--only verify`` for the verify rows alone.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import overhead_restore  # bench/, beside this file
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ckpt_ha import sdk
from ckpt_ha.formats import verify_path
from ckpt_ha.sdk import dcp

CHUNK = 1024 * 1024
BLOCK = 4 * CHUNK


def state_dict(mb: int) -> dict[str, Any]:
    """Layers of 1024 x 1024 float32 (4 MiB each) plus a step: what a model save looks like."""
    torch.manual_seed(0)
    layers = max(1, mb * 2**20 // BLOCK)
    return {
        "model": {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(layers)},
        "step": 1,
    }


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def raw_read(folder: Path) -> int:
    view = memoryview(mmap.mmap(-1, CHUNK))  # page-aligned, like dd bs=1M
    total = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total


def raw_write(files: dict[str, bytes], folder: Path) -> None:
    """Each file written with os.write and fsynced, then the folder's entries fsynced once."""
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:BLOCK]) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def read_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class Bench:
    def __init__(self, base: Path, rounds: int) -> None:
        self.base = base
        self.rounds = rounds
        self.step = 0

    def folder(self, name: str) -> Path:
        self.step += 1
        return self.base / f"{name}-{self.step}"

    def ours(self, state: dict[str, Any]) -> tuple[float, Path]:
        self.step += 1
        step = self.step
        took = timed(
            lambda: dcp.save(
                state, step=step, job_id="dcp", storage_root=str(self.base), run_id="bench"
            )
        )
        return took, self.base / "dcp" / f"step-{step:08d}"

    def plain(self, state: dict[str, Any]) -> tuple[float, Path]:
        folder = self.folder("plain")
        took = timed(lambda: dcp_save(state, storage_writer=FileSystemWriter(folder), no_dist=True))
        return took, folder

    def alternate(
        self, first: Callable[[], tuple[float, Path]], second: Callable[[], tuple[float, Path]]
    ) -> tuple[list[float], list[float], Path]:
        """Rounds of both, in turn which goes first; every folder but one kept of ``second``.
        Each starts with nothing left to write back (``os.sync``, untimed): the removal of the
        last folder is not left to the next side's first fsync."""
        a, b = [], []
        kept = None
        for n in range(self.rounds):
            order = (first, second) if n % 2 == 0 else (second, first)
            for fn in order:
                os.sync()
                took, folder = fn()
                (a if fn is first else b).append(took)
                if fn is second and kept is None:
                    kept = folder
                else:
                    shutil.rmtree(folder)
        assert kept is not None
        return a, b, kept


def ratio(reference: list[float], ours: list[float]) -> str:
    med = statistics.median(reference) / statistics.median(ours)
    pairs = sorted(r / o for r, o in zip(reference, ours, strict=True))
    return f"{med:.2f} (rounds {pairs[0]:.2f}-{pairs[-1]:.2f})"


def row(figure: str, value: str, target: str) -> None:
    print(f"| {figure} | {value} | {target} |", flush=True)


SECTIONS = ("save", "native", "verify", "stall", "restore", "trainer")
"""What ``--only`` picks from (every one by default): the DCP save rows, the native save row,
the verify rows (DCP and Trainer checkpoints), the ``async_save`` stall rows, the restore rows
and the Trainer save row. The machine's raw read figure is always printed."""


def run_size(mb: int, bench: Bench, cold: bool, only: frozenset[str]) -> None:
    state = state_dict(mb)
    if "save" in only or "stall" in only:
        for first_use in (bench.plain, bench.ours):  # imports, allocations: for neither side
            shutil.rmtree(first_use(state)[1])
        # DCP save against plain DCP.
        plain_t, ours_t, dcp_folder = bench.alternate(
            lambda: bench.plain(state), lambda: bench.ours(state)
        )
    else:
        plain_t, (took, dcp_folder) = [], bench.ours(state)
        ours_t = [took]
    total = raw_read(dcp_folder)
    gb = total / 1e9
    print(f"\n### {gb:.2f} GB state ({mb} MB asked), load {os.getloadavg()[0]:.1f}\n")
    print("| figure | measured | target |\n| --- | --- | --- |")

    # The machine's raw figures on the same bytes.
    if "save" in only:
        tensors = {
            f"t{i:04d}.bin": t.numpy().tobytes() for i, t in enumerate(state["model"].values())
        }
        writes = []
        for _ in range(bench.rounds):
            folder = bench.folder("raw")
            folder.mkdir()
            writes.append(timed(lambda f=folder: raw_write(tensors, f)))
            shutil.rmtree(folder)
        row(
            "raw write, os.write + fsync per 4 MiB file",
            f"{gb / statistics.median(writes):.2f} GB/s",
            "—",
        )
    warm = [timed(lambda: raw_read(dcp_folder)) for _ in range(bench.rounds)]
    row("raw read, page cache warm", f"{total / 1e9 / statistics.median(warm):.2f} GB/s", "—")
    if "save" in only:
        row(
            "DCP save: plain `dcp.save` / `ckpt_ha.sdk.dcp.save`",
            f"{ratio(plain_t, ours_t)}; plain {gb / statistics.median(plain_t):.2f} GB/s",
            ">= 0.95",
        )
    if "native" in only:
        native_row(state, bench)
    if "verify" in only:
        verify_rows("DCP", dcp_folder, bench.rounds, cold)
        trainer = overhead_restore.trainer_checkpoint(bench.folder("trainer-verify"), mb)
        verify_rows(f"Trainer ({raw_read(trainer) / 1e9:.2f} GB)", trainer, bench.rounds, cold)
        shutil.rmtree(trainer.parent.parent)
    if "stall" in only:
        stall_rows(state, bench, statistics.median(ours_t))
    shutil.rmtree(dcp_folder)
    if "restore" in only:
        restore_rows(state, bench, mb)
    if "trainer" in only:
        plain_save, ours_save, trainer_gb = overhead_restore.trainer_save(
            bench.folder("trainer"), mb, bench.rounds
        )
        row(
            f"Trainer save ({trainer_gb:.2f} GB): without / with `CkptHaCallback`",
            f"{ratio(plain_save, ours_save)}; without {statistics.median(plain_save):.2f} s",
            ">= 0.95",
        )


def native_row(state: dict[str, Any], bench: Bench) -> None:
    """Native save against os.write + fsync of the same files (those of a first save, which
    also takes the first use's imports and allocations), alternating which goes first."""

    def native() -> tuple[float, Path]:
        bench.step += 1
        step = bench.step
        took = timed(
            lambda: sdk.save(
                str(bench.base), "native", step, {"model": state["model"]}, run_id="bench"
            )
        )
        return took, bench.base / "native" / f"step-{step:08d}"

    first = native()[1]
    files = read_files(first)
    shutil.rmtree(first)

    def raw() -> tuple[float, Path]:
        folder = bench.folder("raw-native")
        folder.mkdir()
        return timed(lambda: raw_write(files, folder)), folder

    raw_t, native_t, kept = bench.alternate(raw, native)
    shutil.rmtree(kept)
    row("native save: os.write + fsync of its files / `sdk.save`", ratio(raw_t, native_t), ">= 0.9")


def verify_rows(what: str, folder: Path, rounds: int, cold: bool) -> None:
    """``ckpt-ha verify`` of ``folder`` against a raw read of its files, warm (and cold)."""
    verify_warm, read_warm = [], []
    for _ in range(rounds):
        read_warm.append(timed(lambda: raw_read(folder)))
        verify_warm.append(timed(lambda: _verified(folder)))
    row(
        f"verify {what}, warm: raw read / `ckpt-ha verify`", ratio(read_warm, verify_warm), ">= 0.9"
    )
    if not cold:
        return
    verify_cold, read_cold = [], []
    for _ in range(rounds):
        drop_caches()
        read_cold.append(timed(lambda: raw_read(folder)))
        drop_caches()
        verify_cold.append(timed(lambda: _verified(folder)))
    gb = raw_read(folder) / 1e9
    row("raw read of it, page cache cold", f"{gb / statistics.median(read_cold):.2f} GB/s", "—")
    row(
        f"verify {what}, cold: raw read / `ckpt-ha verify`", ratio(read_cold, verify_cold), ">= 0.9"
    )


def stall_rows(state: dict[str, Any], bench: Bench, sync_s: float) -> None:
    """async_save stall, as a share of a synchronous save (``sync_s``)."""
    stager = DefaultStager(StagingOptions(False, False, False, False))
    stager.stage(state)  # a stager that already holds its copy, as ckpt-ha's after prepare_async
    plain_blocked, plain_cpu = [], []
    for _ in range(bench.rounds + 1):
        folder = bench.folder("plain-async")
        started, cpu = time.perf_counter(), time.thread_time()
        upload = dcp_async_save(state, storage_writer=FileSystemWriter(folder), async_stager=stager)
        plain_cpu.append(time.thread_time() - cpu)
        plain_blocked.append(time.perf_counter() - started)
        cast(Future[Any], upload).result()
        shutil.rmtree(folder)
    stager.close()
    dcp.prepare_async(state)
    ours_blocked, ours_cpu = [], []
    for _ in range(bench.rounds + 2):
        bench.step += 1
        started, cpu = time.perf_counter(), time.thread_time()
        handle = dcp.async_save(
            state, step=bench.step, job_id="async", storage_root=str(bench.base), run_id="bench"
        )
        ours_cpu.append(time.thread_time() - cpu)
        ours_blocked.append(time.perf_counter() - started)
        handle.result()
        shutil.rmtree(bench.base / "async" / f"step-{bench.step:08d}")
    plain_share = statistics.median(plain_blocked) / sync_s
    row(
        "async_save stall, plain `dcp.async_save` (stager holding its copy), share of a sync save",
        f"{plain_share:.1%} ({statistics.median(plain_blocked):.3f} s, "
        f"CPU {statistics.median(plain_cpu):.3f} s)",
        "—",
    )
    row(
        "async_save stall, ckpt-ha's first save after `prepare_async`",
        f"{ours_blocked[0] / sync_s:.1%} ({ours_blocked[0]:.3f} s, CPU {ours_cpu[0]:.3f} s)",
        f"<= {plain_share + 0.02:.1%} (plain + 2 points)",
    )
    later, later_cpu = statistics.median(ours_blocked[1:]), statistics.median(ours_cpu[1:])
    row(
        "async_save stall, ckpt-ha's later saves (median)",
        f"{later / sync_s:.1%} ({later:.3f} s, CPU {later_cpu:.3f} s)",
        "<= 5%",
    )


def restore_rows(state: dict[str, Any], bench: Bench, mb: int) -> None:
    """A raw read of the files plus the framework's own load, against the verified load."""
    plain_load, resumed = overhead_restore.dcp_restore(
        bench.folder("restore"), state, bench.rounds, timed, raw_read
    )
    row(
        "restore DCP, warm: raw read + `dcp.load` / `dcp.resume`",
        ratio(plain_load, resumed),
        ">= 0.85",
    )
    plain_train, ours_train = overhead_restore.hf_restore(
        bench.folder("hf"), mb, bench.rounds, timed, raw_read
    )
    row(
        "restore Trainer, warm: raw read + `trainer.train(resume_from_checkpoint=)` / `hf.train`",
        ratio(plain_train, ours_train),
        ">= 0.85",
    )


def _verified(folder: Path) -> None:
    report = verify_path(folder)
    assert report.ok, report.reasons


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, nargs="+", default=[300, 2000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache rows")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=SECTIONS, help="run only these rows"
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    cold = not args.no_cold and drop_caches()
    if not args.no_cold and not cold:
        print("not root: the cold-cache rows are left out")
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()}, torch {torch.__version__}")
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-overhead-", dir=args.dir))
    try:
        for mb in args.mb:
            run_size(mb, Bench(base, args.rounds), cold, frozenset(args.only))
    finally:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
