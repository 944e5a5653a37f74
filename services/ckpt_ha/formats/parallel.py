"""Verification work shared between the calling thread and one long-lived pool per process.

The calling thread takes jobs too, so a verification never waits for a pool thread (all of
them may be busy with other checkpoints, or stuck on a hung mount), and a job may itself run
jobs here (the files of a checkpoint, then the chunks of one large file) without deadlock.
File reads and xxh3/sha256 release the GIL, so the threads hash in parallel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from ckpt_ha.storage.bounded import Workers

T = TypeVar("T")

_pool = Workers(os.cpu_count() or 1)
"""Threads that help check the files of a checkpoint (started on first use)."""


def run(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``jobs`` on the calling thread and up to one pool thread per CPU besides, each
    taking the next job not yet taken; their results (or errors) in the order of ``jobs``."""
    return start(jobs, helpers_only_for=0)()


def start(jobs: Sequence[Callable[[], T]], *, helpers_only_for: int = 1) -> Callable[[], list[T]]:
    """Start ``jobs`` on the pool now and return the join: calling it makes the calling thread
    take the jobs no pool thread has taken yet, then returns every result (or raises the first
    job's error), in order. Between the two the caller does other work (e.g. parse a file while
    the pool reads the others). ``helpers_only_for``: jobs the caller leaves to the pool while
    it is away (one helper more than `run` starts)."""
    futures: list[Future[T]] = [Future() for _ in jobs]
    taken = iter(range(len(jobs)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(taken, None)
            if i is None:
                return
            try:
                futures[i].set_result(jobs[i]())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, in order
                futures[i].set_exception(exc)

    for _ in range(min(_pool.size, len(jobs) - 1 + helpers_only_for)):
        _pool.submit(work)  # a helper that starts after the last job was taken does nothing

    def join() -> list[T]:
        work()
        return [future.result() for future in futures]

    return join
