"""The guard of the fast tier (`tests/unit`, `tests/contract`): no network, no process, no torch.

`scripts/check` runs these two folders in a minute or two on a machine with no servers and no
PyTorch. A test there that opens a socket, starts a process or imports torch belongs in
`tests/integration` (or `tests/system` when it runs the whole stack); this guard makes it fail
with a message saying so instead of passing slowly, or only where the servers happen to run.

* Sockets: `socket.socket.connect` / `connect_ex` raise (that covers `socket.create_connection`,
  `asyncio.open_connection`, redis, nats, boto3, urllib). `socket.socketpair`, which asyncio uses
  for its self-pipe, does not connect and stays allowed.
* Processes: `subprocess.Popen` (hence `asyncio.create_subprocess_exec/_shell`), the fork/exec
  primitive under it and under multiprocessing, `os.fork`, `os.posix_spawn[p]`, `os.system` raise.
* torch (and transformers, which imports it): importing it while a fast-tier module is collected
  or one of its tests runs raises ModuleNotFoundError, as on a machine without it; a session of
  only fast-tier tests also fails at its end if torch was imported at all.
"""

from __future__ import annotations

import _posixsubprocess  # type: ignore[import-not-found]
import contextlib
import importlib.abc
import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

TESTS = Path(__file__).resolve().parents[1]
FAST_TIERS = (TESTS / "unit", TESTS / "contract")
HEAVY_MODULES = ("torch", "transformers")
WHERE = "move it to tests/integration (tests/system if it runs the whole stack)"


class FastTierViolation(AssertionError):
    """A fast-tier test reached for the network, a process or torch."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the fast tier (tests/unit, tests/contract) {what}: {WHERE}")


def _refuse(what: str) -> Any:
    def refused(*_args: object, **_kwargs: object) -> NoReturn:
        raise FastTierViolation(what)

    return refused


def _refuse_popen(self: subprocess.Popen[Any], *_args: object, **_kwargs: object) -> NoReturn:
    self._child_created = False  # what Popen.__del__ reads on an instance it never started
    raise FastTierViolation("starts no process (subprocess.Popen)")


def _refuse_connect(what: str) -> Any:
    def refused(self: socket.socket, address: object, *_args: object) -> NoReturn:
        raise FastTierViolation(f"opens no network socket ({what} to {address!r})")

    return refused


class _HeavyImportBlocker(importlib.abc.MetaPathFinder):
    """Makes `import torch` fail as it does where torch is not installed, while `depth` > 0.

    One instance stays on the meta path once inserted: a test that snapshots and restores
    `sys.meta_path` (pytester does) cannot strand an active blocker there."""

    depth = 0

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> None:
        if self.depth and _heavy(fullname):
            raise ModuleNotFoundError(
                f"the fast tier (tests/unit, tests/contract) runs without {fullname}: {WHERE}",
                name=fullname,
            )


_BLOCKER = _HeavyImportBlocker()


def _heavy(name: str) -> bool:
    return name.split(".")[0] in HEAVY_MODULES


@contextlib.contextmanager
def heavy_imports_blocked() -> Iterator[None]:
    """`import torch` raises and `importlib.util.find_spec("torch")` is None, as without torch
    (find_spec consults the meta path too, where the blocker would raise instead)."""
    upstream = importlib.util._find_spec  # type: ignore[attr-defined]

    def find_spec(name: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        return None if _heavy(name) else upstream(name, path, target)

    if _BLOCKER not in sys.meta_path:
        sys.meta_path.insert(0, _BLOCKER)
    _BLOCKER.depth += 1
    importlib.util._find_spec = find_spec  # type: ignore[attr-defined]
    try:
        yield
    finally:
        importlib.util._find_spec = upstream  # type: ignore[attr-defined]
        _BLOCKER.depth -= 1


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """While open: sockets do not connect, processes do not start, torch does not import."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _refuse_connect("connect"))
        mp.setattr(socket.socket, "connect_ex", _refuse_connect("connect_ex"))
        mp.setattr(subprocess.Popen, "__init__", _refuse_popen)
        mp.setattr(_posixsubprocess, "fork_exec", _refuse("starts no process (fork_exec)"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"starts no process (os.{name})"))
        heavy_before = {m for m in HEAVY_MODULES if m in sys.modules}
        with heavy_imports_blocked():
            yield
        imported = {m for m in HEAVY_MODULES if m in sys.modules} - heavy_before
        if imported:
            raise FastTierViolation(f"imports no {', '.join(sorted(imported))}")


def in_fast_tier(path: Path) -> bool:
    return any(path.is_relative_to(tier) for tier in FAST_TIERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A fast-tier test module is imported with torch unimportable."""
    if isinstance(collector, pytest.Module) and in_fast_tier(collector.path):
        with heavy_imports_blocked():
            yield
    else:
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session of only fast-tier tests (`scripts/check`) proves it never loaded torch."""
    items = getattr(session, "items", [])
    if not items or not all(in_fast_tier(item.path) for item in items):
        return
    loaded = [m for m in HEAVY_MODULES if m in sys.modules]
    if loaded:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the fast tier loaded {', '.join(loaded)}; it must run without it: {WHERE}"
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
