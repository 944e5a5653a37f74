"""Loopback ports: picking a free one, probing one, and retrying a start that lost the race for
the port it was given."""

from __future__ import annotations

import socket
from collections.abc import Callable

from ckpt_ha.lab.devstack.procs.errors import ProcessStartFailed
from ckpt_ha.runtime.local_stack import ManagedProcess

LOCALHOST = "127.0.0.1"
PROBE_TIMEOUT = 0.5


PORT_TAKEN = "is already in use"
"""How `start_process` says a port it was given is taken before it starts anything."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the usual bind-to-0 race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR like the servers themselves: TIME_WAIT leftovers from our previous run on the
    # same port are fine, a live listener (someone else's server) is not.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOCALHOST, port))
        except OSError:
            return False
        return True


def accepts_tcp(port: int) -> bool:
    try:
        with socket.create_connection((LOCALHOST, port), timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def retry_port_race(
    start: Callable[[], ManagedProcess], *, ports_chosen_here: bool, attempts: int = 3
) -> ManagedProcess:
    """`free_port` can race with any other process binding (or connecting from) the same
    port; when we chose the port, a lost race is retried with fresh ports: the process failing
    to bind it, or `start_process` finding it taken before the start."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except ProcessStartFailed as exc:
            lost_race = "address already in use" in exc.log_tail.lower() or exc.reason.endswith(
                PORT_TAKEN
            )
            if not (ports_chosen_here and lost_race) or attempt == attempts:
                raise
    raise AssertionError("unreachable")
