"""The runner's hang watch over one attempt: reads the ranks' progress marks, stops a hung one.

While an attempt runs (its processes alive: the adapter's ``wait`` has not returned), a task of
the runner reads every rank's mark (`ckpt_ha.sdk.marks`, ``<progress file>.rank<R>``) once per
``every_s`` and feeds them to `ckpt_ha.runner.hang.HangDetector`. On a verdict it stops the
attempt through its adapter (`SchedulerAdapter.stop`: the local process group, torchrun and its
ranks with it; ``scancel`` on Slurm) and returns the `Hang`; the runner then waits for the
attempt's end as for any other, reports ``job.failed`` v3 cause ``hang`` and awaits the plan.
The plan names the next attempt: from then on the registrar fences every commit of the hung
one (its fencing epoch, the attempt number, has risen), even one that a process that somehow
survived would still make.

Why the runner and not the restore-coordinator: only the supervisor knows the processes are
alive (a silent attempt whose processes are gone is a crash or a lost host, already covered),
only it can stop them, and it reads the marks on its own host without the bus (a hang is often
a stalled network). The coordinator still sees everything: the ``job.failed`` it plans from
names the cause, the last step and the ranks that stopped first.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from ckpt_ha.runner.adapter import SchedulerAdapter
from ckpt_ha.runner.hang import Hang, HangDetector, HangPolicy
from ckpt_ha.sdk import marks

log = logging.getLogger("ckpt_ha.runner")
STOP_GRACE_S = 10.0
"""Between SIGTERM and SIGKILL when stopping a hung attempt."""
_RANK_FILE = re.compile(r"\.rank(\d+)$")


def rank_files(progress_file: Path) -> dict[int, str]:
    """The marks beside ``progress_file``: rank → path."""
    found: dict[int, str] = {}
    for path in glob.glob(f"{glob.escape(str(progress_file))}.rank*"):
        match = _RANK_FILE.search(path)
        if match is not None:
            found[int(match.group(1))] = path
    return found


def clear(progress_file: Path) -> None:
    """Remove the marks of an earlier attempt (before the next one starts)."""
    for path in rank_files(progress_file).values():
        Path(path).unlink(missing_ok=True)


class HangWatch:
    """The watch over one running attempt: its task, and the hang it declared (set before the
    attempt is stopped, so the attempt's end, which the stop causes, is never mistaken for a
    failure of its own)."""

    def __init__(self) -> None:
        self.hang: Hang | None = None
        self.task: asyncio.Task[Hang] | None = None


async def outcome(watch: HangWatch | None) -> Hang | None:
    """The watch's verdict once its attempt ended: the hang it declared (after the stop has
    finished: every process of the attempt is gone before the failure is reported and a
    relaunch can follow), or None (the watch is cancelled: the attempt ended by itself)."""
    if watch is None or watch.task is None:
        return None
    if watch.hang is None:
        watch.task.cancel()
    try:
        await watch.task
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - a broken watch must not hide the attempt's end
        log.warning("the hang watch failed: %r", exc)
    return watch.hang


def _read_all(progress_file: Path) -> dict[int, marks.Mark | None]:
    return {rank: marks.read(path) for rank, path in rank_files(progress_file).items()}


def start(
    progress_file: Path, policy: HangPolicy, adapter: SchedulerAdapter, say: Callable[[str], None]
) -> HangWatch:
    """The watch of the attempt about to start, as a task of the running loop."""
    holder = HangWatch()
    holder.task = asyncio.create_task(watch(progress_file, policy, adapter, say, holder))
    return holder


async def watch(
    progress_file: Path,
    policy: HangPolicy,
    adapter: SchedulerAdapter,
    say: Callable[[str], None],
    holder: HangWatch,
    *,
    every_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    grace_s: float = STOP_GRACE_S,
) -> Hang:
    """Until the attempt hangs (cancelled when it ends first): the hang, once the attempt was
    stopped (``holder.hang`` is set before). The marks are read in a worker thread: a stalled
    filesystem must not stall the runner's heartbeats."""
    detector = HangDetector(policy)
    while True:
        await asyncio.sleep(every_s)
        read = await asyncio.to_thread(_read_all, progress_file)
        now = clock()
        for rank, mark in read.items():
            detector.observe(rank, mark, now)
        hang = detector.verdict(now)
        if hang is not None:
            holder.hang = hang
            say(f"{hang.detail()}: stopping the attempt")
            log.warning("attempt hung: %s", hang.detail())
            await asyncio.to_thread(adapter.stop, grace_s)
            return hang
