"""One replica at a time runs a periodic loop: the holder of its lease (`ckpt_ha.registry.leases`).

Every replica of a service shares its durable consumers, so event handling splits between them
by itself; a periodic loop (a scan of the storage root, a scrub, a reconcile round, a retention
round) would run once per replica instead. Each replica tries to take the loop's lease every
third of its lifetime; the one that holds it runs the loop and renews the lease, the others
wait. A holder that stops gives the lease up (another replica takes it at its next try); one
that dies loses it when it expires. A holder that cannot renew (Redis unreachable, another
replica took the lease after the process stalled) stops the loop once the lease's lifetime since
its last renewal has passed, so two replicas overlap only by a stall longer than that lifetime,
and the loops' effects are idempotent even then (event ids keyed on what they concern, the
registry's compare-and-set).

Who runs which loop is on /metrics (``ckpt_ha_loop_leader``, labelled with the replica) and in
the log (one line when a replica starts running a loop, one when it stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from ckpt_ha.registry.leases import RedisLeases
from ckpt_ha.telemetry.metrics import ServiceMetrics

log = logging.getLogger("ckpt_ha.runtime.leader")

Loop = Callable[[], Coroutine[Any, Any, None]]


def replica_id() -> str:
    """This process among its service's replicas: the host name (a pod's name in Kubernetes)
    and the process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def stop_if_cancelled() -> None:
    """Raise `asyncio.CancelledError` if the current task was cancelled, even when the code it
    ran lost that cancellation. CPython 3.11's ``asyncio.wait_for`` (under nats-py's and
    redis-py's calls) returns its result when the cancellation arrives as that result does,
    and the task runs on; it still counts the request (`asyncio.Task.cancelling`). A periodic
    loop checks here between rounds, so it stops at its next round instead of running on while
    whoever cancelled it (a shutdown, a lost lease) waits for it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def next_round(seconds: float) -> None:
    """Between two rounds of a periodic loop: `stop_if_cancelled`, then sleep ``seconds``."""
    stop_if_cancelled()
    await asyncio.sleep(seconds)


class Leader:
    """Runs one loop of a service on the replica holding its lease ``<service>:<loop>``."""

    def __init__(
        self,
        leases: RedisLeases,
        metrics: ServiceMetrics,
        loop: str,
        ttl_s: float,
        *,
        replica: str | None = None,
    ) -> None:
        self.leases = leases
        self.metrics = metrics
        self.loop = loop
        self.name = f"{metrics.service}:{loop}"
        """The lease's name."""
        self.ttl_s = ttl_s
        self.replica = replica or replica_id()
        self.every_s = ttl_s / 3
        self._gauge = metrics.loop_leader.labels(metrics.service, loop, self.replica)
        self._gauge.set(0)

    async def run(self, loop: Loop) -> None:
        """Forever: wait for the lease, run ``loop`` while it is held, stop it when lost. On
        cancellation (shutdown) the loop is cancelled and the lease given up."""
        try:
            while True:
                await self._until_held()
                self._gauge.set(1)
                log.info("replica %s runs %s (lease %s)", self.replica, self.loop, self.name)
                task = asyncio.create_task(loop())
                try:
                    await self._while_held(task)
                finally:
                    self._gauge.set(0)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                log.warning("replica %s stopped running %s: lease lost", self.replica, self.loop)
        finally:
            self._gauge.set(0)
            with contextlib.suppress(RedisError, OSError, asyncio.CancelledError):
                await asyncio.shield(self.leases.release(self.name, self.replica))

    async def _take(self) -> bool | None:
        """True: held for another lifetime; False: another replica holds it; None: unknown."""
        try:
            return await self.leases.take(self.name, self.replica, self.ttl_s)
        except (RedisError, OSError) as exc:
            log.warning("lease %s: %r", self.name, exc)
            return None

    async def _until_held(self) -> None:
        held = await self._take()
        while held is not True:
            await next_round(self.every_s)
            held = await self._take()

    async def _while_held(self, task: asyncio.Task[None]) -> None:
        """Renew until the lease is lost (or the loop ended by itself)."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while not task.done():
            stop_if_cancelled()
            await asyncio.wait({task}, timeout=self.every_s)
            if task.done():
                break
            held = await self._take()
            if held is True:
                renewed = loop.time()
            elif held is False or loop.time() - renewed >= self.ttl_s:
                return
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended: %r", self.loop, task.exception())
