"""Where a training process runs: the runner's environment variables, and how the SDK publishes.

A runner (`ckpt-ha run`, or a Kubernetes / Slurm adapter) launches the training command with
``CKPT_HA_JOB``, ``CKPT_HA_RUN_ID``, ``CKPT_HA_ATTEMPT``, ``CKPT_HA_STORAGE_ROOT``, ``NATS_URL``,
``CKPT_HA_SUBJECT_PREFIX`` and, on a relaunch after ``resume.planned``, ``CKPT_HA_RESUME_PLAN``
(the plan as JSON) plus ``CKPT_HA_RESTORE_URI`` / ``CKPT_HA_RESTORE_STEP`` / ``CKPT_HA_PLAN_ID``.
`context()` reads them once, with the launcher's ``RANK`` / ``WORLD_SIZE`` (torchrun's); outside
a runner it returns None and the SDK behaves as before.

Publishing is best effort. A checkpoint's and a resume's announcements (`try_announce`) are
published before the call returns, on a short-lived connection; a bus that is down costs one
failed connect, then they are skipped for `BusEndpoint.retry_after_s`. Per-step progress reports go
through one background publisher per bus instead (`ckpt_ha.sdk.publisher`), so a training step
never waits for the bus.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import nats
import nats.errors
from pydantic import SecretStr, ValidationError

from ckpt_ha import credentials
from ckpt_ha.contracts import EventData, build, framing
from ckpt_ha.contracts.checkpoint import RuntimeEnvironment, Topology
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.contracts.subjects import DEFAULT_PREFIX
from ckpt_ha.telemetry import traceparent as w3c

log = logging.getLogger("ckpt_ha.sdk")
M = TypeVar("M", ResumePlannedV2, RuntimeEnvironment, Topology)
SOURCE = "ckpt-ha/sdk"

# The environment-variable protocol between a runner and the training process.
JOB, RUN_ID, ATTEMPT = "CKPT_HA_JOB", "CKPT_HA_RUN_ID", "CKPT_HA_ATTEMPT"
STORAGE_ROOT, PROGRESS_FILE = "CKPT_HA_STORAGE_ROOT", "CKPT_HA_PROGRESS_FILE"
NATS_URL, SUBJECT_PREFIX = "NATS_URL", "CKPT_HA_SUBJECT_PREFIX"
EVENTS_STREAM = "CKPT_HA_EVENTS_STREAM"
NATS_USER, NATS_PASSWORD = "CKPT_HA_NATS_USER", "CKPT_HA_NATS_PASSWORD"  # or ..._PASSWORD_FILE
NATS_CA_FILE = "CKPT_HA_NATS_CA_FILE"
RESUME_PLAN, RESTORE_URI = "CKPT_HA_RESUME_PLAN", "CKPT_HA_RESTORE_URI"
RESTORE_STEP, PLAN_ID = "CKPT_HA_RESTORE_STEP", "CKPT_HA_PLAN_ID"
ENVIRONMENT, TOPOLOGY = "CKPT_HA_ENVIRONMENT", "CKPT_HA_TOPOLOGY"
CODE_VERSION = "CKPT_HA_CODE_VERSION"
JOB_KEY = "CKPT_HA_JOB_KEY"
"""This job's signing key (hex), derived by the runner: the SDK signs its job's events with it."""
RANK, WORLD_SIZE = "RANK", "WORLD_SIZE"  # set by torchrun (and most launchers) for each process


class BadContext(ValueError):
    """The runner's environment variables are present but malformed."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(f"${name}: {reason}")


@dataclass(frozen=True)
class BusEndpoint:
    """Where to announce: a NATS URL plus the subject prefix (defaults match the services).

    Where NATS requires authentication, the SDK connects as the user its runner gave it (the
    ``job`` user of deploy/nats/permissions.conf); a ``tls://`` URL is verified against
    ``ca_file`` (else the system's trust store).
    """

    url: str
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = 5.0
    user: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: str | None = None
    retry_after_s: float = 30.0
    """After a failed announcement, skip announcing on this bus for this long (and the progress
    publisher's longest wait between two connect attempts)."""
    progress_queue: int = 1024
    """How many progress reports may wait for the bus; beyond that the oldest is dropped."""
    job_key: bytes | None = field(default=None, repr=False)
    """The job's signing key (`ckpt_ha.contracts.signing`): the services refuse a job's
    ``checkpoint.writing`` / ``committed``, ``job.progress`` and ``resume.*`` without it."""

    def __post_init__(self) -> None:
        if self.ca_file and credentials.scheme(self.url) != "tls":
            raise credentials.PlaintextWithCa(NATS_CA_FILE, self.url, "tls")

    @property
    def servers(self) -> list[str]:
        """The servers of ``url`` (a cluster's nodes, separated by commas), for ``nats.connect``."""
        return credentials.nats_servers(self.url)

    @property
    def shown_url(self) -> str:
        """The URL for logs (a password in it replaced)."""
        return ",".join(credentials.redact_url(part) for part in self.servers)

    def connect_options(self) -> dict[str, Any]:
        """User, password and TLS context for ``nats.connect``."""
        return credentials.nats_options(self.url, self.user, self.password, self.ca_file)


@dataclass(frozen=True)
class Context:
    """One attempt of one job, as its runner described it."""

    job_id: str
    run_id: str
    attempt: int
    storage_root: str | None
    bus: BusEndpoint | None
    plan: ResumePlannedV2 | None = None
    """Set on a relaunch: the restore this attempt must carry out (`sdk.resume`)."""
    progress_file: str | None = None
    """Where `sdk.progress` writes the last step, for the runner's ``job.failed``."""
    environment: RuntimeEnvironment | None = None
    """What the runner reported in ``job.started``; checkpoints record the same."""
    topology: Topology | None = None
    code_version: str | None = None
    rank: int = 0
    """This process's rank in a multi-process job (``RANK``); 0 for a single process."""
    world_size: int = 1
    """How many processes the job runs (``WORLD_SIZE``); each saves through `ckpt_ha.sdk.dcp`."""


def context(env: Mapping[str, str] | None = None) -> Context | None:
    """The attempt this process is, from the runner's variables; None outside a runner."""
    env = os.environ if env is None else env
    job = env.get(JOB)
    if not job:
        return None
    attempt = _number(env, ATTEMPT, 1)
    rank, world_size = launched_as(env)
    url = env.get(NATS_URL)
    try:
        bus = (
            BusEndpoint(
                url,
                prefix=env.get(SUBJECT_PREFIX) or DEFAULT_PREFIX,
                user=env.get(NATS_USER) or None,
                password=credentials.read_secret(env, NATS_PASSWORD),
                ca_file=env.get(NATS_CA_FILE) or None,
                job_key=_job_key(env),
            )
            if url
            else None
        )
    except credentials.CredentialsError as exc:
        raise BadContext(exc.name, exc.reason) from None
    return Context(
        job_id=job,
        run_id=env.get(RUN_ID) or job,
        attempt=attempt,
        storage_root=env.get(STORAGE_ROOT) or None,
        bus=bus,
        plan=_parsed(env, RESUME_PLAN, ResumePlannedV2),
        progress_file=env.get(PROGRESS_FILE) or None,
        environment=_parsed(env, ENVIRONMENT, RuntimeEnvironment),
        topology=_parsed(env, TOPOLOGY, Topology),
        code_version=env.get(CODE_VERSION) or None,
        rank=rank,
        world_size=world_size,
    )


def launched_as(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` as the launcher set them (``RANK`` / ``WORLD_SIZE``: torchrun,
    most launchers), under a runner or not; ``(0, 1)`` for a process launched alone."""
    env = os.environ if env is None else env
    rank, world_size = _number(env, RANK, 0), _number(env, WORLD_SIZE, 1)
    if not 0 <= rank < max(world_size, 1):
        raise BadContext(RANK, f"{rank} is not a rank of a world of {world_size}")
    return rank, world_size


def _job_key(env: Mapping[str, str]) -> bytes | None:
    raw = env.get(JOB_KEY)
    if not raw:
        return None
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise BadContext(JOB_KEY, "not hex digits") from None


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name) or str(default)
    try:
        return int(raw)
    except ValueError:
        raise BadContext(name, f"{raw!r} is not a number") from None


def _parsed(env: Mapping[str, str], name: str, model: type[M]) -> M | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadContext(name, f"not a valid {model.__name__}: {first['msg']}") from None


_down_until: dict[str, float] = {}
_down_lock = threading.Lock()


def try_announce(
    bus: BusEndpoint | None,
    data: EventData,
    time_: datetime,
    key: str | None = None,
    *,
    always: bool = False,
    traceparent: str | None = None,
) -> bool:
    """Publish ``data`` (event id from ``key``); False instead of raising when the bus is down.

    ``traceparent`` (W3C) puts the event in that trace: set on the envelope and the NATS
    header, so the services' spans about it join the trace (see `trace_context`).

    A failure makes later calls skip the bus for `BusEndpoint.retry_after_s`, unless ``always`` (for
    the few events that matter more than a second's delay: resume outcomes).
    """
    if bus is None:
        return False
    with _down_lock:
        if not always and _down_until.get(bus.url, 0.0) > time.monotonic():
            return False
    key = key if key is not None else f"{data.EVENT_TYPE}|{data.subject_key()}"
    try:
        _run_blocking(lambda: _announce(bus, data, time_, key, traceparent), bus.timeout_s * 2)
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        log.warning("%s: announcing %s failed (%r)", data.subject_key(), data.EVENT_TYPE, exc)
        with _down_lock:
            _down_until[bus.url] = time.monotonic() + bus.retry_after_s
        return False
    return True


def _run_blocking(make: Callable[[], Coroutine[Any, Any, None]], timeout_s: float) -> None:
    """Run a coroutine to the end from synchronous code, even where this thread already runs
    an event loop (a notebook, an async trainer): then in a worker thread of its own."""

    async def bounded() -> None:
        await asyncio.wait_for(make(), timeout=timeout_s)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(bounded())
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, bounded()).result()


def trace_context() -> str:
    """The ``traceparent`` a checkpoint's events carry: the training code's current span when
    it traces with OpenTelemetry, else a fresh trace id (the services' spans then form the trace;
    the SDK itself records no spans, and imports OpenTelemetry only if the training code has)."""
    return w3c.current_or_new()


def envelope_bytes(
    bus: BusEndpoint, data: EventData, time_: datetime, key: str, traceparent: str | None = None
) -> tuple[str, bytes, dict[str, str]]:
    """Subject, body and NATS headers (JetStream dedupe id, trace, the job's signature when
    the runner gave this process its job key: `ckpt_ha.contracts.framing`) of the SDK's
    envelope for ``data``."""
    envelope = build(data, source=SOURCE, time=time_, key=key, traceparent=traceparent)
    subject = framing.subject(bus.prefix, envelope)
    body = envelope.to_bytes()
    headers = framing.headers(envelope.id, subject, body, key=bus.job_key, traceparent=traceparent)
    return subject, body, headers


async def _announce(
    bus: BusEndpoint, data: EventData, time_: datetime, key: str, traceparent: str | None = None
) -> None:
    subject, body, headers = envelope_bytes(bus, data, time_, key, traceparent)
    nc = await nats.connect(
        bus.servers,
        **bus.connect_options(),
        connect_timeout=bus.timeout_s,
        max_reconnect_attempts=1,
        allow_reconnect=False,
    )
    try:
        await nc.jetstream().publish(
            subject,
            body,
            timeout=bus.timeout_s,
            headers=headers,
        )
    finally:
        await nc.close()
