"""The background publisher behind `sdk.progress`: a training step never waits for the bus.

One publisher per bus and process: a daemon thread with its own asyncio loop and one NATS
connection, created on the first report and closed at exit (`close_all`, run by ``atexit``
after flushing what it can). Reports wait in a bounded queue; `ProgressPublisher.submit` only
appends to it, so it never blocks and never touches the network.

When the queue is full the **oldest** report is dropped: the newest step is what the
restore-coordinator needs most (recompute range, continuity after a resume), and an old report
delivered late says less than a fresh one. What could not be delivered is counted: ``dropped``
(pushed out of a full queue, or still queued at exit while the bus was down) and ``failed`` (the
broker did not take it), logged at the first and then every `LOG_EVERY`-th, available from
`stats()`, and carried in the next published report as ``dropped_reports`` (the total so far).

The bus being down costs a failed connect, then a back-off (doubling from
`FIRST_RETRY_S` up to `BusEndpoint.retry_after_s`) while reports keep queueing.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats
import nats.errors

from ckpt_ha.contracts.job import JobProgressV1
from ckpt_ha.sdk.protocol import BusEndpoint, envelope_bytes

log = logging.getLogger("ckpt_ha.sdk")

LOG_EVERY = 1000
"""A warning at the first lost report, then at every this many."""
FIRST_RETRY_S = 0.5


@dataclass(frozen=True)
class PublisherStats:
    """What one publisher did so far (counts since it started)."""

    queued: int
    """Waiting in the queue now."""
    published: int
    dropped: int
    """Pushed out of the full queue (oldest first), or left queued at exit with the bus down."""
    failed: int
    """Taken from the queue but not accepted by the broker (error or no ack in time)."""
    connects: int
    """Connections opened: stays 1 while the broker stays reachable."""
    connect_failures: int
    connected: bool

    @property
    def lost(self) -> int:
        """Reports that will never be published: ``dropped + failed``."""
        return self.dropped + self.failed


@dataclass(frozen=True)
class _Report:
    data: JobProgressV1
    time: datetime
    key: str


class ProgressPublisher:
    """Publishes `JobProgressV1` reports for one bus in the background (see the module doc)."""

    def __init__(self, bus: BusEndpoint, *, capacity: int | None = None) -> None:
        self.bus = bus
        self.capacity = capacity if capacity is not None else bus.progress_queue
        if self.capacity < 1:
            raise ValueError(f"queue capacity {self.capacity} must be >= 1")
        self._lock = threading.Lock()
        self._queue: collections.deque[_Report] = collections.deque()
        self._published = self._dropped = self._failed = 0
        self._connects = self._connect_failures = 0
        self._in_flight = False
        self._connected = False
        self._down = False  # the last connect failed: waiting for the back-off to end
        self._closing = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._idle = False
        self._settled = threading.Condition(self._lock)

    # --- the training thread's side: never blocks on the bus -------------------------------

    def submit(self, data: JobProgressV1, time_: datetime, key: str) -> bool:
        """Queue one report; False if that pushed the oldest queued report out."""
        with self._lock:
            if self._closing:
                self._count_lost("dropped", 1)
                return False
            dropped = len(self._queue) >= self.capacity
            if dropped:
                self._queue.popleft()
                self._count_lost("dropped", 1)
            self._queue.append(_Report(data, time_, key))
            loop, wake = self._start_locked()
            # Wake the loop only when it sleeps: a busy publisher picks the report up anyway,
            # and a step then costs no system call.
            idle, self._idle = self._idle, False
        if idle and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop just ended (exit)
                loop.call_soon_threadsafe(wake.set)
        return not dropped

    def stats(self) -> PublisherStats:
        with self._lock:
            return PublisherStats(
                queued=len(self._queue),
                published=self._published,
                dropped=self._dropped,
                failed=self._failed,
                connects=self._connects,
                connect_failures=self._connect_failures,
                connected=self._connected,
            )

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued report is published; True if so. Returns early (False)
        while the bus is known to be down: waiting would only delay the caller."""
        deadline = time.monotonic() + timeout_s
        with self._settled:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0 or self._down or self._thread is None:
                    return False
                self._settled.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float) -> None:
        """Flush (within ``timeout_s``), then stop the thread and close the connection. Reports
        still queued are counted as dropped."""
        self.flush(timeout_s)
        with self._lock:
            self._closing = True
            thread, loop, wake = self._thread, self._loop, self._wake
        if thread is None or loop is None:
            return
        if wake is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)
        thread.join(timeout_s)

    def _start_locked(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Event | None]:
        if self._thread is None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._wake = asyncio.Event()  # bound to `loop` on first use, in the thread
            self._thread = threading.Thread(
                target=self._run, args=(loop,), name="ckpt-ha-progress", daemon=True
            )
            self._thread.start()
        assert self._loop is not None
        return self._loop, self._wake

    def _count_lost(self, kind: str, n: int) -> None:
        """Count ``n`` lost reports (lock held); log at the first and every `LOG_EVERY`-th."""
        before = self._dropped + self._failed
        if kind == "dropped":
            self._dropped += n
        else:
            self._failed += n
        after = before + n
        if before == 0 or after // LOG_EVERY > before // LOG_EVERY:
            log.warning(
                "job.progress: %d report(s) not published so far on %s (%d dropped from the "
                "full queue of %d, %d failed)",
                after, self.bus.shown_url, self._dropped, self.capacity, self._failed,
            )  # fmt: skip

    # --- the publisher thread -------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()
            with self._settled:
                self._connected = False
                if self._queue:  # the bus was down at exit
                    self._count_lost("dropped", len(self._queue))
                    self._queue.clear()
                self._settled.notify_all()

    async def _main(self) -> None:
        assert self._wake is not None
        wake = self._wake
        nc: Any = None
        retry_at, backoff = 0.0, FIRST_RETRY_S
        try:
            while True:
                with self._settled:
                    pending, closing = bool(self._queue), self._closing
                    if not pending:
                        self._idle = True
                        self._settled.notify_all()
                if not pending:
                    if closing:
                        return
                    await wake.wait()
                    wake.clear()
                    continue
                if nc is None:
                    wait = retry_at - time.monotonic()
                    if wait > 0:
                        if closing:
                            return  # bus down at exit: what is queued stays unpublished
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(wake.wait(), timeout=wait)
                        wake.clear()
                        continue
                    nc = await self._connect()
                    if nc is None:
                        retry_at = time.monotonic() + backoff
                        backoff = min(backoff * 2, max(self.bus.retry_after_s, FIRST_RETRY_S))
                        continue
                    backoff = FIRST_RETRY_S
                if not await self._publish_next(nc):
                    await _close_quietly(nc)
                    nc = None
                    retry_at = time.monotonic() + backoff
        finally:
            if nc is not None:
                await _close_quietly(nc)

    async def _connect(self) -> Any:
        async def quiet(exc: Exception) -> None:
            log.debug("progress publisher on %s: %r", self.bus.shown_url, exc)

        try:
            nc = await nats.connect(
                self.bus.servers,
                **self.bus.connect_options(),
                connect_timeout=self.bus.timeout_s,
                # One try now; retrying is this publisher's back-off (nats-py reads 0 attempts
                # as "retry the first connect forever").
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=quiet,
                name="ckpt-ha-sdk-progress",
            )
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            with self._settled:
                self._connect_failures += 1
                self._down = True
                first = self._connect_failures == 1
                self._settled.notify_all()
            (log.warning if first else log.debug)(
                "job.progress: cannot reach NATS at %s (%r); reports queue meanwhile",
                self.bus.shown_url, exc,
            )  # fmt: skip
            return None
        with self._lock:
            self._connects += 1
            self._connected, self._down = True, False
        return nc

    async def _publish_next(self, nc: Any) -> bool:
        """Publish the oldest report; False when the connection is gone."""
        with self._lock:
            report = self._queue.popleft()
            self._in_flight = True
            lost = self._dropped + self._failed
        data = report.data.model_copy(update={"dropped_reports": lost}) if lost else report.data
        subject, body, headers = envelope_bytes(self.bus, data, report.time, report.key)
        ok = True
        try:
            await nc.jetstream().publish(subject, body, timeout=self.bus.timeout_s, headers=headers)
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            ok = not (nc.is_closed or not nc.is_connected)
            with self._lock:
                self._count_lost("failed", 1)
                if not ok:
                    self._connected = False
            log.debug("job.progress %s not published: %r", report.key, exc)
        else:
            with self._lock:
                self._published += 1
        finally:
            with self._settled:
                self._in_flight = False
                self._settled.notify_all()
        return ok


async def _close_quietly(nc: Any) -> None:
    with contextlib.suppress(Exception):
        await nc.close()


_publishers: dict[tuple[int, BusEndpoint], ProgressPublisher] = {}
_registry_lock = threading.Lock()


def publisher_for(bus: BusEndpoint) -> ProgressPublisher:
    """This process's publisher for ``bus`` (created on first use; a forked child gets its own,
    since the parent's thread does not exist in the child)."""
    key = (os.getpid(), bus)
    with _registry_lock:
        found = _publishers.get(key)
        if found is None:
            if not _publishers:
                atexit.register(close_all)
            found = _publishers[key] = ProgressPublisher(bus)
        return found


def stats_for(bus: BusEndpoint) -> PublisherStats | None:
    """The stats of this process's publisher for ``bus``; None if it has none."""
    with _registry_lock:
        found = _publishers.get((os.getpid(), bus))
    return found.stats() if found is not None else None


def flush_all(timeout_s: float) -> bool:
    """Wait (up to ``timeout_s`` in all) for this process's publishers to send what is queued."""
    deadline = time.monotonic() + timeout_s
    with _registry_lock:
        mine = [p for (pid, _), p in _publishers.items() if pid == os.getpid()]
    done = True
    for p in mine:  # every one gets its turn, even after one timed out
        done = p.flush(max(0.0, deadline - time.monotonic())) and done
    return done


def close_all() -> None:
    """Flush and close every publisher of this process (at exit; each waits at most its bus's
    ``timeout_s``, and not at all while its bus is down)."""
    with _registry_lock:
        mine = [(k, p) for k, p in _publishers.items() if k[0] == os.getpid()]
        for k, _ in mine:
            del _publishers[k]
    for _, p in mine:
        p.close(p.bus.timeout_s)
