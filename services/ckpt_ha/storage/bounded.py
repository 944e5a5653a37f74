"""Storage calls from the event loop, each waited for at most a bound.

The `ObjectStore` API is synchronous; services run it off the event loop. A hung mount (an NFS
server gone, a parallel filesystem stuck) blocks the thread doing the call inside the kernel,
where nothing can interrupt it. What can be bounded is the wait: `call` gives up after its
timeout with `StorageTimeout` (a transient `StorageUnavailable`, so a handler naks and a
background round retries later) while the stuck thread stays behind until the mount answers.

The calls run on a small pool of this module's own daemon threads, never on the event loop's
default executor: stuck threads there would starve what asyncio itself runs on it (host name
lookups when NATS or Redis reconnect), and would keep the process from exiting. When every
worker is stuck, further calls wait in line and time out the same way, saying so.

One process, one pool and one default bound: the composition root sets them (`configure`)
from the settings; S3 calls are bounded by their client's own timeouts besides.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ckpt_ha.storage.errors import StorageUnavailable

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 300.0
"""Generous: one call may verify a whole checkpoint's shards."""
DEFAULT_WORKERS = 8


class StorageTimeout(StorageUnavailable):
    """A storage call did not return within its bound (the thread doing it may still hang)."""

    def __init__(self, what: str, timeout_s: float, *, stuck: int) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self.stuck = stuck
        busy = f"; {stuck} storage call(s) still running past their bound" if stuck else ""
        super().__init__(
            reason=f"{what} did not return within {timeout_s:g}s (storage hung?){busy}",
            backend="storage",
        )


_Job = tuple[concurrent.futures.Future[Any], Callable[[], Any]]


class Workers:
    """A fixed set of daemon threads taking calls from one queue, started on first use (also
    the pool `formats.listed` checks a checkpoint's files on)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._started = 0
        self._lock = threading.Lock()
        self.overdue = 0
        """Calls whose caller gave up while they still run (a thread stuck in the kernel)."""

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((future, fn))
        with self._lock:
            while self._started < self.size:
                self._started += 1
                threading.Thread(
                    target=self._work, name=f"ckpt-storage-{self._started}", daemon=True
                ).start()
        return future

    def _work(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
            # An idle worker must not keep its last call (its closure, its result) alive until
            # the next one: a watcher's last read would hold its whole listing.
            del future, fn

    def late(self, delta: int) -> None:
        with self._lock:
            self.overdue += delta


_config = {"timeout_s": DEFAULT_TIMEOUT_S, "workers": DEFAULT_WORKERS}
_pool: Workers | None = None
_pool_lock = threading.Lock()


def configure(*, timeout_s: float, workers: int = DEFAULT_WORKERS) -> None:
    """This process's default bound and pool size (its composition root calls this once)."""
    if timeout_s <= 0 or workers < 1:
        raise ValueError(f"need timeout_s > 0 and workers >= 1, got {timeout_s} and {workers}")
    global _pool
    with _pool_lock:
        _config.update(timeout_s=timeout_s, workers=workers)
        if _pool is not None and _pool.size != workers:
            _pool = None  # the old threads finish what they hold, then idle on as daemons


def _workers() -> Workers:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = Workers(int(_config["workers"]))
        return _pool


async def call(
    fn: Callable[..., T], /, *args: Any, timeout_s: float | None = None, extra_s: float = 0.0
) -> T:
    """``fn(*args)`` on a storage worker thread (with the caller's context, e.g. its trace
    span), waited for at most ``timeout_s`` (default: `configure`'s): `StorageTimeout` then.
    ``extra_s`` is added to the bound: time the call spends waiting on purpose (a read budget,
    `read_budget`), which says nothing about a hung mount."""
    bound = (_config["timeout_s"] if timeout_s is None else timeout_s) + extra_s
    workers = _workers()
    ctx = contextvars.copy_context()
    future = workers.submit(functools.partial(ctx.run, fn, *args))
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), bound)
    except TimeoutError:
        if future.cancel():  # never started: all workers busy
            raise StorageTimeout(_name(fn), bound, stuck=workers.overdue) from None
        workers.late(+1)
        future.add_done_callback(lambda _: workers.late(-1))
        raise StorageTimeout(_name(fn), bound, stuck=workers.overdue) from None


def _name(fn: Callable[..., Any]) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__qualname__", None) or type(inner).__name__
