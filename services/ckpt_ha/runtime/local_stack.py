"""What a running local stack leaves under ``$CKPT_HA_HOME``, and how a process logs in to it.

The lab's embedded stack (`ckpt_ha.lab.devstack.stack`: ``ckpt-ha up``) writes ``stack.json``
(where its NATS, Redis and storage are, and the processes it started) and generates the
passwords and signing key under ``secrets/``. The product's CLI reads them (`StackState.load`,
`login_settings`) so that its commands reach a running local stack without any setting; it
starts nothing. This is the one reader and writer of that file format, so the two cannot drift.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr

from ckpt_ha import credentials
from ckpt_ha.bus import permissions
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import signing
from ckpt_ha.registry import acl
from ckpt_ha.registry.client import RedisConfig

STATE_FILE = "stack.json"
SECRETS = "secrets"
OPERATOR, RUNNER, JOB = "operator", "runner", "job"
"""NATS users of the CLI, of `ckpt-ha run`, of the training processes the runner starts."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class ManagedProcess:
    """A detached process we started, as recorded in a state file.

    ``port`` is 0 for a process that listens on nothing. ``marker`` must occur in the process's
    command line and ``start_ticks`` (``/proc/<pid>/stat`` field 22) must equal its start time
    for the pid to be treated as still ours; an empty ``marker`` falls back to ``name``.
    """

    name: str
    pid: int
    port: int
    url: str
    log_path: Path
    http_port: int | None = None
    marker: str = ""
    start_ticks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["log_path"] = str(self.log_path)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManagedProcess:
        http_port = data.get("http_port")
        start_ticks = data.get("start_ticks")
        return cls(
            name=_field(data, "name", str),
            pid=_field(data, "pid", int),
            port=_field(data, "port", int),
            url=_field(data, "url", str),
            log_path=Path(_field(data, "log_path", str)),
            http_port=None if http_port is None else _field(data, "http_port", int),
            marker=str(data.get("marker", "")),
            start_ticks=None if start_ticks is None else _field(data, "start_ticks", int),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ManagedProcess:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"ManagedProcess JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)


def _field(data: Mapping[str, Any], key: str, kind: type[_T]) -> _T:
    value = data[key]
    # bool is an int subclass; a pid or port of True is a corrupt record, not 1.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"ManagedProcess.{key} must be {kind.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class StackSecrets:
    """The embedded stack's passwords and signing key, one file each, readable by the owner
    only, generated once and kept across `down` / `up` (deleting the folder rotates them all
    at the next `up` after a `down`)."""

    folder: Path

    @classmethod
    def of(cls, home: Path) -> StackSecrets:
        return cls(home / SECRETS)

    def nats(self, user: str) -> Path:
        return self.folder / f"nats-{user}.password"

    def redis(self, user: str) -> Path:
        return self.folder / f"redis-{user}.password"

    @property
    def signing_key(self) -> Path:
        return self.folder / "signing.key"

    def ensure(self) -> None:
        """Create whatever secret is missing; never change one that exists."""
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        wanted = [
            *((self.nats(u), secrets.token_urlsafe(32)) for u in permissions.users()),
            *((self.redis(u), secrets.token_urlsafe(32)) for u in acl.users()),
            (self.signing_key, secrets.token_bytes(32).hex()),
        ]
        for path, value in wanted:
            if path.exists():
                continue
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(value + "\n")

    def read(self, path: Path) -> SecretStr:
        return credentials.read_secret_file(path, str(path))


@dataclass(frozen=True)
class StackState:
    home: Path
    nats_url: str
    redis_url: str
    storage_root: str
    processes: tuple[ManagedProcess, ...]
    nats_secured: bool = False
    """The stack started this NATS with its users (else NATS_URL's credentials apply)."""
    redis_secured: bool = False
    """The stack started this Redis with its ACL users (else REDIS_URL's credentials apply)."""
    storage_endpoint: str = ""
    """The S3 endpoint the stack's processes use: its `STORAGE_LINK` in front of the server of
    ``AWS_ENDPOINT_URL``; empty without a link (a filesystem root, or S3 reached directly)."""

    @property
    def secrets(self) -> StackSecrets:
        return StackSecrets.of(self.home)

    def to_json(self) -> str:
        return json.dumps(
            {
                "home": str(self.home),
                "nats_url": self.nats_url,
                "redis_url": self.redis_url,
                "storage_root": self.storage_root,
                "nats_secured": self.nats_secured,
                "redis_secured": self.redis_secured,
                "storage_endpoint": self.storage_endpoint,
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
            nats_secured=bool(doc.get("nats_secured", False)),
            redis_secured=bool(doc.get("redis_secured", False)),
            storage_endpoint=str(doc.get("storage_endpoint") or ""),
        )

    def save(self) -> None:
        """Written readable by the owner only: a ``NATS_URL`` / ``REDIS_URL`` given with a
        password in it is kept here as given (the CLI reconnects with it)."""
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.home / f"{STATE_FILE}.tmp"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.to_json())
        tmp.replace(self.home / STATE_FILE)


def logins(state: StackState, principal: str) -> dict[str, str | Path]:
    """What makes a process ``principal`` of this stack, by settings field: a user name, or
    the file holding a secret. A service name, ``runner`` (which hands the ``job`` login to its
    training processes) or ``operator`` (the CLI, drills)."""
    keep = state.secrets
    found: dict[str, str | Path] = {"signing_key": keep.signing_key}
    if state.nats_secured:
        found |= {"nats_user": principal, "nats_password": keep.nats(principal)}
        if principal == RUNNER:
            found |= {"job_nats_user": JOB, "job_nats_password": keep.nats(JOB)}
    if state.redis_secured and principal in acl.users():
        found |= {"redis_user": principal, "redis_password": keep.redis(principal)}
    return found


def login_env(state: StackState, principal: str) -> dict[str, str]:
    """`logins` as the environment of a child process: ``CKPT_HA_<FIELD>`` for a name,
    ``CKPT_HA_<FIELD>_FILE`` for a secret (whose plain variable is emptied, so that an
    inherited value cannot conflict with it)."""
    env: dict[str, str] = {}
    for field, value in logins(state, principal).items():
        name = "CKPT_HA_" + field.upper()
        if isinstance(value, Path):
            env[name], env[name + credentials.FILE_SUFFIX] = "", str(value)
        else:
            env[name] = value
    return env


def login_settings(state: StackState, principal: str) -> dict[str, str | SecretStr]:
    """`logins` as settings values (secrets read from their files)."""
    return {
        field: state.secrets.read(value) if isinstance(value, Path) else value
        for field, value in logins(state, principal).items()
    }


def bus_config(state: StackState, principal: str = OPERATOR) -> BusConfig:
    """This stack's NATS as ``principal`` (drills and tests read and publish as ``operator``),
    with the stack's signing key (held by the services, the runner and operators)."""
    keep = state.secrets
    master = signing.parse_master(keep.read(keep.signing_key).get_secret_value())
    if not state.nats_secured:
        return BusConfig(url=state.nats_url, signing_keys=(master,))
    password = keep.read(keep.nats(principal))
    return BusConfig(url=state.nats_url, user=principal, password=password, signing_keys=(master,))


def redis_config(state: StackState, principal: str = OPERATOR) -> RedisConfig:
    """This stack's Redis as ``principal``."""
    keep = state.secrets
    if not state.redis_secured:
        return RedisConfig(url=state.redis_url)
    password = keep.read(keep.redis(principal))
    return RedisConfig(url=state.redis_url, user=principal, password=password)
