"""Start, watch and stop private infrastructure processes (nats-server, redis-server, services).

Used by the embedded ``ckpt-ha up/down/status`` stack and by tests that need a broker or a Redis
of their own to pause, kill and restart. Synchronous and stdlib-only on purpose: the CLI calls it
before any event loop exists, and tests call it from fixtures.

Processes are spawned detached (their own session, stdin from /dev/null, stdout and stderr
appended to ``<home>/logs/<name>.log``) so they outlive the launcher, and are described by a
:class:`ManagedProcess` that serialises to JSON for a state file. Every signal we send is
preceded by an identity check against ``/proc/<pid>`` (start time and command line), so a pid
recorded yesterday and recycled by the kernel since is never signalled.
"""

from __future__ import annotations

from ckpt_ha.lab.devstack.procs.binaries import (
    nats_server_binary,
    redis_server_binary,
    redis_server_version,
)
from ckpt_ha.lab.devstack.procs.errors import (
    BinaryNotFound,
    ProcessNotRunning,
    ProcessStartFailed,
    ProcsError,
)
from ckpt_ha.lab.devstack.procs.liveness import is_alive, kill, pause, resume, signal_if_ours, stop
from ckpt_ha.lab.devstack.procs.nats_server import start_nats
from ckpt_ha.lab.devstack.procs.ports import LOCALHOST, accepts_tcp, free_port, retry_port_race
from ckpt_ha.lab.devstack.procs.redis_server import start_redis, start_sentinel
from ckpt_ha.lab.devstack.procs.spawn import DEFAULT_START_TIMEOUT, start_process
from ckpt_ha.runtime.local_stack import ManagedProcess

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "LOCALHOST",
    "BinaryNotFound",
    "ManagedProcess",
    "ProcessNotRunning",
    "ProcessStartFailed",
    "ProcsError",
    "accepts_tcp",
    "free_port",
    "is_alive",
    "kill",
    "nats_server_binary",
    "pause",
    "redis_server_binary",
    "redis_server_version",
    "resume",
    "retry_port_race",
    "signal_if_ours",
    "start_nats",
    "start_process",
    "start_redis",
    "start_sentinel",
    "stop",
]
