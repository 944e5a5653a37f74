"""Named contexts: which platform a command talks to, chosen by name (`ckpt-ha --context prod
…`, ``$CKPT_HA_CONTEXT``, else the file's ``current``), from one file (``$CKPT_HA_CONTEXTS``,
default ``$CKPT_HA_HOME/contexts.toml``)::

    current = "prod"

    [contexts.prod]
    nats_url = "tls://nats.ckpt-ha.svc:4222"
    redis_url = "rediss://redis.ckpt-ha.svc:6379/0"
    storage_root = "s3://ckpt/prod"
    nats_user = "viewer"
    nats_password_file = "/run/secrets/nats-viewer"     # a secret is always a file
    nats_ca_file = "/run/secrets/ca.crt"
    redis_user = "viewer"
    redis_password_file = "/run/secrets/redis-viewer"
    redis_ca_file = "/run/secrets/ca.crt"

    [contexts.prod.health]                              # optional: `status` reads /readyz
    registrar = ["http://registrar-0.ckpt-ha:8080", "http://registrar-1.ckpt-ha:8080"]

A context names NATS, Redis and the storage together, or it is refused (`half-set`): one
command never reads one platform and writes another. The rules of `resolve`, for every command:

* a context is chosen: its three endpoints, never the local stack's, never the environment's
  (``NATS_URL``, ``REDIS_URL`` or ``CKPT_HA_STORAGE_ROOT`` set beside it is refused);
* none is chosen and the environment names ``NATS_URL`` and ``REDIS_URL``: those (the storage
  root from ``CKPT_HA_STORAGE_ROOT``), never the local stack's;
* only one of the two: refused in one line;
* neither: the local stack under ``$CKPT_HA_HOME`` when one runs (`ckpt-ha up`).

Pure and light (stdlib ``tomllib``): the parser and the offline commands use it on the light
install.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_ha.cli.arguments import UsageError

FILE = "contexts.toml"
ENV_FILE = "CKPT_HA_CONTEXTS"
ENV_NAME = "CKPT_HA_CONTEXT"
ENDPOINTS = ("nats_url", "redis_url", "storage_root")
ENDPOINT_ENV = {"nats_url": "NATS_URL", "redis_url": "REDIS_URL",
                "storage_root": "CKPT_HA_STORAGE_ROOT"}  # fmt: skip
PLAIN = frozenset({
    *ENDPOINTS, "nats_user", "nats_ca_file", "redis_user", "redis_ca_file",
    "redis_sentinel_user", "subject_prefix", "events_stream", "dead_letter_stream",
    "progress_stream", "registry_prefix", "stream_replicas",
})  # fmt: skip
"""Settings a context may set (`ckpt_ha.runtime.settings.ServiceSettings` fields); anything
else comes from the environment as usual."""
SECRETS = frozenset({"nats_password", "redis_password", "redis_sentinel_password", "signing_key"})
"""Secrets a context names by file only (``<name>_file``), never by value."""


@dataclass(frozen=True)
class Context:
    name: str
    source: Path
    settings: Mapping[str, Any]
    """Plain settings by field name."""
    secret_files: Mapping[str, Path] = field(default_factory=dict)
    """Secret settings by field name: the file holding each."""
    health: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Health endpoints by service (base URLs; `status` reads ``/readyz``)."""


@dataclass(frozen=True)
class Resolved:
    """Where a command's endpoints come from: ``kind`` is ``context``, ``environment``,
    ``local`` (the local stack) or ``default`` (nothing set, no local stack)."""

    kind: str
    context: Context | None = None

    def describe(self, home: Path) -> str:
        if self.context is not None:
            return f"{self.context.name} (from {self.context.source})"
        return {
            "environment": "none: NATS_URL and REDIS_URL from the environment",
            "local": f"none: the local stack under {home}",
        }.get(self.kind, "none: the defaults (nothing set, no local stack running)")


def path(env: Mapping[str, str], home: Path) -> Path:
    return Path(env.get(ENV_FILE) or home / FILE).expanduser()


def load(file: Path) -> tuple[str | None, dict[str, Context]]:
    """The file's ``current`` and its contexts; a missing file has none. A malformed file, an
    unknown setting or a secret given by value is a `UsageError` naming the file."""
    if not file.exists():
        return None, {}
    try:
        doc = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{file}: cannot read the contexts: {exc}") from None
    current = doc.get("current")
    if current is not None and not isinstance(current, str):
        raise UsageError(f"{file}: current must be a context name")
    tables = doc.get("contexts", {})
    if not isinstance(tables, dict):
        raise UsageError(f"{file}: [contexts.NAME] tables expected")
    return current, {name: _context(file, name, t) for name, t in tables.items()}


def _context(file: Path, name: str, table: Any) -> Context:
    where = f"{file}: context {name!r}"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: a table of settings expected")
    plain: dict[str, Any] = {}
    secrets: dict[str, Path] = {}
    health: dict[str, tuple[str, ...]] = {}
    for key, value in table.items():
        if key == "health":
            health = _health(where, value)
        elif key in SECRETS:
            raise UsageError(f'{where}: {key} by value; name its file: {key}_file = "PATH"')
        elif key.removesuffix("_file") in SECRETS and key.endswith("_file"):
            secrets[key.removesuffix("_file")] = (file.parent / str(value)).expanduser()
        elif key in PLAIN:
            plain[key] = value
        else:
            known = ", ".join(sorted([*PLAIN, *(f"{s}_file" for s in SECRETS), "health"]))
            raise UsageError(f"{where}: unknown setting {key!r} (known: {known})")
    return Context(name, file, plain, secrets, health)


def _health(where: str, value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict) or not all(
        isinstance(urls, list) and all(isinstance(u, str) for u in urls) for urls in value.values()
    ):
        raise UsageError(f'{where}: health = {{ SERVICE = ["http://HOST:PORT", …] }} expected')
    return {service: tuple(urls) for service, urls in value.items()}


def chosen(env: Mapping[str, str], home: Path) -> Context | None:
    """The context this command uses: ``$CKPT_HA_CONTEXT`` (`--context` sets it), else the
    file's ``current``; None when neither names one. An unknown name is a `UsageError`."""
    file = path(env, home)
    current, contexts = load(file)
    name = env.get(ENV_NAME) or current
    if not name:
        return None
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise UsageError(f"no context {name!r} in {file} (known: {known})")
    return contexts[name]


def resolve(
    env: Mapping[str, str],
    home: Path,
    local_stack_running: bool,
    uses: tuple[str, ...] = ("NATS_URL", "REDIS_URL"),
) -> Resolved:
    """Where this command's NATS, Redis and storage come from, by the rules above; a mix is a
    `UsageError` in one line. ``uses``: the endpoints the command talks to (`ckpt-ha run`
    talks to NATS only, so its ``NATS_URL`` alone is whole)."""
    context = chosen(env, home)
    if context is not None:
        missing = [k for k in ENDPOINTS if not context.settings.get(k)]
        if missing:
            named = [k for k in ENDPOINTS if k not in missing]
            raise UsageError(
                f"context {context.name!r} ({context.source}) is half-set: it names "
                f"{', '.join(named) or 'nothing'} but not {', '.join(missing)}; a context names "
                "NATS, Redis and the storage together"
            )
        beside = [v for k, v in ENDPOINT_ENV.items() if env.get(v)]
        if beside:
            raise UsageError(
                f"context {context.name!r} and ${beside[0]} both name an endpoint: unset "
                f"{', '.join('$' + b for b in beside)} or choose no context"
            )
        return Resolved("context", context)
    urls = [v for v in uses if env.get(v)]
    if 0 < len(urls) < len(uses):
        other = "REDIS_URL" if urls[0] == "NATS_URL" else "NATS_URL"
        raise UsageError(
            f"${urls[0]} is set but ${other} is not: set both (a deployment), or neither (the "
            "local stack), or choose a context (--context NAME)"
        )
    if urls:
        return Resolved("environment")
    return Resolved("local" if local_stack_running else "default")
