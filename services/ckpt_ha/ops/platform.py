"""Is the platform up? What `ckpt-ha status` reads from a deployment, with nothing but the
credentials of a context (the read-only ``viewer`` is enough): no process table, no local
state file.

* NATS: the streams (messages, sequences) and each service's durable consumers: the pull
  requests waiting on a consumer are its idle replicas (JetStream counts them: NATS-discovered
  replicas, no list of hosts needed), and its lag (pending, unacknowledged, redelivered);
* the dead letters per service, replay markers apart;
* Redis and the storage: reachable or not, with the one-line reason;
* each service's health endpoints when the context names them (``health``; the local stack's
  are known): replicas and readiness from ``/readyz``.

`writers_running` is the same reading for one question: do the registry's writers run?
`registry rebuild` refuses while they do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.permissions import PRINCIPALS
from ckpt_ha.contracts.subjects import DEAD_LETTERS, REPLAYED

SERVICES = tuple(p.user for p in PRINCIPALS[:5])
"""The five services, by their NATS user (which is also their name)."""
REGISTRY_WRITERS = ("registrar", "restore-coordinator", "retention-janitor")
"""The services that write under the registry prefix: stopped before a rebuild."""
LOOPS = {"scan": "writer-watcher", "scrub": "integrity-checker",
         "reconcile": "integrity-checker", "lost": "restore-coordinator",
         "retention": "retention-janitor"}  # fmt: skip
"""The periodic loops a replica runs under a lease (`ckpt_ha.runtime.leader`), by the lease
name's first part, and their service: a lease held is a replica that runs (the writer-watcher
has no consumer, so its lease is how it is seen)."""
SAMPLES, SAMPLE_GAP_S = 3, 0.4
"""A replica busy with a batch has no pull request waiting: the consumers are read a few times
and each one's most waiting requests counted."""
HTTP_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ConsumerState:
    service: str
    durable: str
    stream: str
    waiting: int = 0
    """Pull requests waiting (the most seen over the samples): idle replicas."""
    pending: int = 0
    ack_pending: int = 0
    redelivered: int = 0
    missing: bool = False
    """The consumer does not exist (the service never started against this stream)."""


@dataclass(frozen=True)
class StreamState:
    name: str
    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    missing: bool = False


@dataclass(frozen=True)
class Endpoint:
    service: str
    url: str
    ready: bool
    detail: str


@dataclass(frozen=True)
class Reachability:
    ok: bool
    detail: str


@dataclass
class PlatformStatus:
    nats: Reachability
    redis: Reachability
    storage: Reachability
    streams: list[StreamState] = field(default_factory=list)
    consumers: list[ConsumerState] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)
    """Dead letters per service (replay markers not counted)."""
    replayed: int = 0
    endpoints: list[Endpoint] = field(default_factory=list)
    leases: dict[str, str] = field(default_factory=dict)
    """Loop leases held now: lease name → the replica holding it (``host:pid``)."""

    def service_rows(self) -> list[dict[str, Any]]:
        """Per service: replicas seen (ready endpoints, else waiting pull requests), whether it
        is up, and its lag summed over its consumers."""
        rows = []
        for service in SERVICES:
            mine = [c for c in self.consumers if c.service == service]
            ends = [e for e in self.endpoints if e.service == service]
            waiting = max((c.waiting for c in mine), default=0)
            loops = sorted(n for n in self.leases if LOOPS.get(n.split(":")[0]) == service)
            if ends:
                ready = sum(e.ready for e in ends)
                up, seen = ready == len(ends) and ready > 0, f"{ready}/{len(ends)} ready"
            elif mine:
                up, seen = waiting > 0, f"{waiting} pulling"
            else:
                up, seen = bool(loops), f"{len(loops)} loop(s) held"
            rows.append({
                "service": service,
                "up": up,
                "replicas": seen,
                "pending": sum(c.pending for c in mine),
                "ack_pending": sum(c.ack_pending for c in mine),
                "redelivered": sum(c.redelivered for c in mine),
                "missing_consumers": [c.durable for c in mine if c.missing],
                "dead_letters": self.dead_letters.get(service, 0),
                "loops": {n: self.leases[n] for n in loops},
            })  # fmt: skip
        return rows

    @property
    def healthy(self) -> bool:
        reached = self.nats.ok and self.redis.ok and self.storage.ok
        reached = reached and not any(s.missing for s in self.streams)
        return reached and all(r["up"] and not r["missing_consumers"] for r in self.service_rows())

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "nats": asdict(self.nats),
            "redis": asdict(self.redis),
            "storage": asdict(self.storage),
            "services": self.service_rows(),
            "streams": [asdict(s) for s in self.streams],
            "consumers": [asdict(c) for c in self.consumers],
            "dead_letters": {"by_service": self.dead_letters, "replayed": self.replayed},
            "endpoints": [asdict(e) for e in self.endpoints],
            "leases": self.leases,
        }


def durables(cfg: BusConfig, services: Sequence[str] = SERVICES) -> dict[str, tuple[str, str]]:
    """Each durable consumer of ``services``: its service and its stream."""
    progress = cfg.progress_stream or cfg.events_stream
    found: dict[str, tuple[str, str]] = {}
    for p in PRINCIPALS:
        if p.user in services:
            for durable, stream in p.durable_streams(cfg.events_stream, progress).items():
                found[durable] = (p.user, stream)
    return found


async def _consumers(
    js: JetStreamContext, cfg: BusConfig, services: Sequence[str]
) -> list[ConsumerState]:
    wanted = durables(cfg, services)
    seen: dict[str, ConsumerState] = {}
    for sample in range(SAMPLES):
        if sample:
            await asyncio.sleep(SAMPLE_GAP_S)
        for durable, (service, stream) in wanted.items():
            try:
                info = await js.consumer_info(stream, durable)
            except nats.js.errors.NotFoundError:
                seen[durable] = ConsumerState(service, durable, stream, missing=True)
                continue
            before = seen.get(durable)
            seen[durable] = ConsumerState(
                service,
                durable,
                stream,
                waiting=max(info.num_waiting or 0, before.waiting if before else 0),
                pending=info.num_pending or 0,
                ack_pending=info.num_ack_pending or 0,
                redelivered=info.num_redelivered or 0,
            )
    return list(seen.values())


async def _streams(js: JetStreamContext, cfg: BusConfig) -> list[StreamState]:
    found = []
    for name in filter(None, (cfg.events_stream, cfg.dead_letter_stream, cfg.progress_stream)):
        try:
            info = await js.stream_info(name)
        except nats.js.errors.NotFoundError:
            found.append(StreamState(name, missing=True))
            continue
        s = info.state
        found.append(StreamState(name, s.messages, s.bytes, s.first_seq, s.last_seq))
    return found


async def _dead_letters(js: JetStreamContext, cfg: BusConfig) -> tuple[dict[str, int], int]:
    """Messages per service in the dead-letter stream, and the replay markers."""
    info = await js.stream_info(cfg.dead_letter_stream, subjects_filter=">")
    by_service: dict[str, int] = {}
    replayed = 0
    for subject, count in (info.state.subjects or {}).items():
        parts = subject.split(".")
        if len(parts) < 3 or parts[1] != DEAD_LETTERS:
            continue
        if parts[2] == REPLAYED:
            replayed += count
        else:
            by_service[parts[2]] = by_service.get(parts[2], 0) + count
    return by_service, replayed


async def _connect(cfg: BusConfig) -> NatsClient:
    return await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


async def _nats_part(cfg: BusConfig, status: PlatformStatus) -> None:
    try:
        nc = await _connect(cfg)
    except (nats.errors.Error, OSError) as exc:
        status.nats = Reachability(False, _why(exc))
        return
    try:
        js = nc.jetstream(timeout=cfg.request_timeout_s)
        status.streams = await _streams(js, cfg)
        status.consumers = await _consumers(js, cfg, SERVICES)
        if not any(s.missing for s in status.streams if s.name == cfg.dead_letter_stream):
            status.dead_letters, status.replayed = await _dead_letters(js, cfg)
        missing = [s.name for s in status.streams if s.missing]
        said = f"streams missing: {', '.join(missing)}" if missing else "streams present"
        status.nats = Reachability(True, f"connected as {cfg.user or 'no user'}; {said}")
    except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
        status.nats = Reachability(False, _why(exc))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _probe(what: Callable[[], Awaitable[str]]) -> Reachability:
    try:
        return Reachability(True, await what())
    except Exception as exc:  # noqa: BLE001 - any failure of a probe is its answer
        return Reachability(False, _why(exc))


def _ready(url: str) -> tuple[bool, str]:
    """GET ``url``/readyz: 200 ready, 503 with the checks that failed, else why not."""
    target = url.rstrip("/") + "/readyz"
    try:
        with urllib.request.urlopen(target, timeout=HTTP_TIMEOUT_S) as reply:  # noqa: S310
            return reply.status == 200, "ready"
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read() or b"{}")
        except ValueError:
            doc = {}
        failing = [k for k, ok in (doc.get("checks") or {}).items() if not ok]
        if doc and not doc.get("started", True):
            failing.append("not started")
        return False, f"HTTP {exc.code}" + (f": {', '.join(failing)}" if failing else "")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, _why(getattr(exc, "reason", exc))


async def _endpoints(health: Mapping[str, Sequence[str]]) -> list[Endpoint]:
    pairs = [(service, url) for service, urls in health.items() for url in urls]
    answers = await asyncio.gather(*(asyncio.to_thread(_ready, url) for _, url in pairs))
    return [
        Endpoint(service, url, ok, detail)
        for (service, url), (ok, detail) in zip(pairs, answers, strict=True)
    ]


async def platform_status(
    cfg: BusConfig,
    redis_probe: Callable[[], Awaitable[tuple[str, dict[str, str]]]],
    storage_probe: Callable[[], Awaitable[str]],
    health: Mapping[str, Sequence[str]],
) -> PlatformStatus:
    """Everything at once; each part's failure is its row, never the whole answer's.
    ``redis_probe``: a line about Redis and the loop leases held."""
    status = PlatformStatus(
        Reachability(False, "not checked"),
        Reachability(False, "not checked"),
        Reachability(False, "not checked"),
    )

    async def redis_part() -> str:
        line, status.leases = await redis_probe()
        return line

    _, status.redis, status.storage, status.endpoints = await asyncio.gather(
        _nats_part(cfg, status), _probe(redis_part), _probe(storage_probe), _endpoints(health)
    )
    return status


async def writers_running(cfg: BusConfig) -> dict[str, list[str]]:
    """The registry's writers that have a replica waiting on one of their consumers (read a
    few times: a busy replica waits for nothing), with those consumers."""
    nc = await _connect(cfg)
    try:
        js = nc.jetstream(timeout=cfg.request_timeout_s)
        found: dict[str, list[str]] = {}
        for c in await _consumers(js, cfg, REGISTRY_WRITERS):
            if c.waiting:
                found.setdefault(c.service, []).append(c.durable)
        return found
    finally:
        await nc.close()
