"""How a NATS connection comes back after it was lost: forever, with capped exponential backoff.

nats-py's default gives up after 60 attempts 2 s apart: a broker outage of about two minutes left
a service alive but disconnected for good. A long-lived process (a service, the runner) instead
keeps trying for as long as it runs, waiting ``first_s``, then twice as long after each failed
attempt up to ``max_s``, each wait jittered so that many replicas do not reconnect in lockstep.
A short command gets a bounded connect instead (`ckpt_ha.bus.config.BusConfig.connection_policy`)
and fails with one line.

nats-py calls `ReconnectBackoff` before each reconnect attempt (its
``reconnect_to_server_handler``, in nats-py since 2.14); the first connect of a process retries
``reconnect_time_wait`` apart.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.client import Server


class ReconnectBackoff:
    """nats-py's ``reconnect_to_server_handler``: the server to try next and how long to wait.

    The server tried least since it last answered goes next (a cluster is walked round);
    the wait doubles with that server's failed attempts. ``attempts`` counts the calls, so a
    test can tell how often a client tried while the broker was away.
    """

    def __init__(
        self, first_s: float, max_s: float, *, jitter: float = 0.5, rng: random.Random | None = None
    ) -> None:
        if first_s <= 0 or max_s < first_s:
            raise ValueError(f"need 0 < first_s <= max_s, got {first_s} and {max_s}")
        self.first_s = first_s
        self.max_s = max_s
        self.jitter = jitter
        self.attempts = 0
        self._rng = rng or random.Random()

    def wait(self, failed: int) -> float:
        """The wait before the attempt that follows ``failed`` failed ones (jitter applied)."""
        base = min(self.max_s, self.first_s * 2.0 ** min(failed, 32))
        return base * (1.0 - self.jitter * self._rng.random())

    def __call__(
        self, servers: Sequence[Server], server_info: dict[str, Any]
    ) -> tuple[Server | None, float]:
        self.attempts += 1
        if not servers:
            return None, self.first_s
        chosen = min(servers, key=lambda s: s.reconnects)
        return chosen, self.wait(chosen.reconnects)
