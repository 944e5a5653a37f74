"""The stack the fault suite breaks: the five service processes of the embedded stack
(`ckpt_ha.lab.devstack.stack.up`) on a nats-server and a redis-server of the suite's own
(`ckpt_ha.lab.devstack.procs`, as `tests.support.private_infra` starts them), with S3 storage on a
moto server (`tests.support.moto_server`).

The services reach S3 through one `TcpLink` and the writers through another, so a storage outage
can hit exactly the services' verify, quarantine move or delete, or a writer's write. NATS and
Redis come back on the same ports (and JetStream store and AOF) after a kill or a stop. A killed
service comes back the way the runbook brings one back: `up` starts only what is missing.

Names are the defaults (subject prefix ``ckpt``, streams ``CKPT_EVENTS`` / ``CKPT_DLQ``, registry
prefix ``ckpt-ha``): the servers are the suite's own, so nothing else shares them, and the drill
harness (which reads the defaults) drives training jobs on this stack unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from botocore.config import Config

from ckpt_ha.lab.devstack import procs, stack
from ckpt_ha.lab.devstack.procs import ManagedProcess
from ckpt_ha.runtime import local_stack
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.runtime.local_stack import StackState
from ckpt_ha.storage import ObjectInfo, S3Store
from tests.support import moto_server
from tests.support.bus_tools import SIGNING_KEY
from tests.support.damage import flip_last_byte
from tests.support.moto_server import aws_env, start_moto_server
from tests.support.tcp_gate import TcpLink

PREFIX = "checkpoints"

SERVICE_ENV = {
    # Small budgets, so a fault outlasts them within the suite's time: a handler's retries
    # (max_deliver x backoff) take seconds, a stalled write fails after 8 s.
    "CKPT_HA_ACK_WAIT_S": "5",
    "CKPT_HA_MAX_DELIVER": "4",
    "CKPT_HA_BACKOFF_S": "[0.5, 1, 2]",
    "CKPT_HA_GRACEFUL_TIMEOUT_S": "5",
    "CKPT_HA_POLL_INTERVAL_S": "0.5",
    "CKPT_HA_STALL_TIMEOUT_S": "8",
    "CKPT_HA_SCRUB_INTERVAL_S": "0",
    "CKPT_HA_COPY_INTERVAL_S": "0",  # no copies: the faults compare the registry before/after
    "CKPT_HA_CONSUMER_INFO_INTERVAL_S": "2",
    "CKPT_HA_STATE_METRICS_INTERVAL_S": "2",
    # Re-driving what an outage left behind (a verdict or a write's outcome lost): after 20 s,
    # looked for every 5 s.
    "CKPT_HA_VERIFY_DEADLINE_S": "20",
    "CKPT_HA_WRITING_DEADLINE_S": "20",
    "CKPT_HA_RECONCILE_INTERVAL_S": "5",
    # A killed service's scan, reconcile or retention loop is taken over (by its restart, or
    # another replica) within 3 s.
    "CKPT_HA_LOOP_LEASE_S": "3",
    # Bounded waits: a handler that cannot finish gives its message back within 30 s.
    "CKPT_HA_HANDLER_DEADLINE_S": "30",
    "CKPT_HA_STORAGE_TIMEOUT_S": "30",
}
"""What the fault stack's services run with besides the defaults."""


@dataclass
class FaultStack:
    home: Path
    """``CKPT_HA_HOME`` of the stack: ``stack.json``, secrets (the suite's signing key), logs."""
    nats: ManagedProcess
    redis: ManagedProcess
    bucket: str
    s3_endpoint: str
    services_link: TcpLink
    """The services' way to S3."""
    writer_link: TcpLink
    """The writers' way to S3 (the SDK in this process, training jobs under `ckpt-ha run`)."""
    clients: dict[str, Any] = field(default_factory=dict)

    # -- where things are -------------------------------------------------------------------

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{PREFIX}"

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def env(self) -> dict[str, str]:
        """The environment of every process of the stack (services, CLI, runners)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_HA_", "AWS_"))}
        return {
            **base,
            **SERVICE_ENV,
            **aws_env(self.services_link.endpoint),
            "NATS_URL": self.nats_url,
            "REDIS_URL": self.redis_url,
            "CKPT_HA_HOME": str(self.home),
            "CKPT_HA_STORAGE_ROOT": self.root,
        }

    def writer_env(self) -> dict[str, str]:
        """A training job's environment: the stack's, with S3 through the writers' link."""
        return {**self.env(), **aws_env(self.writer_link.endpoint)}

    def state(self) -> StackState:
        found = StackState.load(self.home)
        assert found is not None, f"no stack under {self.home}"
        return found

    def service(self, name: str) -> ManagedProcess:
        return next(p for p in self.state().processes if p.name == name)

    def _client(self, endpoint: str) -> Any:
        """One boto3 client per endpoint for the whole suite (thread-safe; each holds a pool of
        connections, so one per call would pile up open sockets)."""
        if endpoint not in self.clients:
            self.clients[endpoint] = s3_client(endpoint)
        return self.clients[endpoint]

    def writer_store(self) -> S3Store:
        """The storage root as a writer reaches it (through `writer_link`)."""
        return S3Store(self.bucket, PREFIX, client=self._client(self.writer_link.endpoint))

    def damaging_store(self) -> S3Store:
        """A writer's storage that damages the arrays it is given (`DamagingStore`)."""
        return DamagingStore(self.bucket, PREFIX, client=self._client(self.writer_link.endpoint))

    def services_store(self) -> S3Store:
        """The storage root as the services reach it (through `services_link`)."""
        return S3Store(self.bucket, PREFIX, client=self._client(self.services_link.endpoint))

    def direct_store(self) -> S3Store:
        """The storage root with no link in between: the test's own view of the bytes."""
        return S3Store(self.bucket, PREFIX, client=self._client(self.s3_endpoint))

    # -- the services ------------------------------------------------------------------------

    def up(self) -> StackState:
        """Start whatever service is not running (the runbook's `ckpt-ha up`)."""
        return stack.up(self.home, self.env())

    def kill(self, *names: str) -> None:
        """SIGKILL the named services, no grace."""
        for name in names:
            procs.kill(self.service(name))

    def stop(self, *names: str) -> None:
        """SIGTERM the named services (a graceful stop, as for maintenance)."""
        for name in names:
            procs.stop(self.service(name), timeout=30)

    def restart_all(self) -> None:
        """Every service stopped and started again."""
        self.stop(*SERVICE_NAMES)
        self.up()

    def healthy(self) -> dict[str, bool]:
        return {
            p.name: procs.is_alive(p) and stack.healthz(p.http_port) for p in self.state().processes
        }

    # -- NATS and Redis ----------------------------------------------------------------------

    def kill_nats(self) -> None:
        procs.kill(self.nats)

    def stop_nats(self) -> None:
        procs.stop(self.nats)

    def start_nats(self) -> None:
        """nats-server again on the same ports, with its JetStream store."""
        self.nats = procs.start_nats(
            self.home / "nats-server", port=self.nats.port, http_port=self.nats.http_port
        )

    def pause_redis(self) -> None:
        procs.pause(self.redis)

    def resume_redis(self) -> None:
        procs.resume(self.redis)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The operator's `ckpt-ha` on this stack (with the stack's signing key, as an operator
        has it)."""
        return subprocess.run(
            [sys.executable, "-m", "ckpt_ha.cli.main", *args],
            env={**self.env(), **local_stack.login_env(self.state(), local_stack.OPERATOR)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


class DamagingStore(S3Store):
    """Storage that silently flips one byte of every array a save writes (same size, other
    bytes): the checkpoint commits, and fails verification."""

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        if key.endswith(".npy"):
            data = flip_last_byte(data)
        return super().put(key, data, metadata=metadata)


def s3_client(endpoint: str) -> Any:
    """The suite's client: few retries and short timeouts, so a cut link fails calls quickly."""
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=2,
        read_timeout=10,
        s3={"addressing_style": "path"},
    )
    return moto_server.s3_client(endpoint, config)


def _write_signing_key(home: Path) -> None:
    """The suite's master key as the stack's (`StackSecrets.ensure` keeps an existing one), so
    `tests.support.bus_tools` signs as this stack's jobs would."""
    keep = local_stack.StackSecrets.of(home)
    keep.folder.mkdir(parents=True, exist_ok=True)
    os.chmod(keep.folder, 0o700)
    fd = os.open(keep.signing_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(SIGNING_KEY + "\n")


@contextlib.contextmanager
def running_stack(home: Path) -> Iterator[FaultStack]:
    """The whole stack, started under ``home``; everything it started is stopped at the end."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's log line per request
    endpoint, stop_moto = start_moto_server()
    started: list[ManagedProcess] = []
    links: list[TcpLink] = []
    built: FaultStack | None = None
    try:
        port = int(endpoint.rsplit(":", 1)[1])
        links += [TcpLink(("127.0.0.1", port)), TcpLink(("127.0.0.1", port))]
        nats = procs.start_nats(home / "nats-server")
        started.append(nats)
        redis = procs.start_redis(home / "redis-server")
        started.append(redis)
        bucket = f"faults-{uuid.uuid4().hex[:10]}"
        s3_client(endpoint).create_bucket(Bucket=bucket)
        _write_signing_key(home)
        built = FaultStack(home, nats, redis, bucket, endpoint, links[0], links[1])
        built.up()
        yield built
    finally:
        if built is not None:
            stack.down(home)  # the services, newest first
            started = [built.nats, built.redis]  # the instances running now
        for proc in reversed(started):
            procs.stop(proc, timeout=15)  # continues a paused one first
        for link in links:
            link.close()
        stop_moto()
