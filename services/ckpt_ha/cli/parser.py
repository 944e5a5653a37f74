"""The whole `ckpt-ha` command line, assembled from the command modules: each adds its own
commands, their flags and handlers (`register`), so adding a command touches one module.

A distribution can add commands of its own: an entry point in the ``ckpt_ha.cli`` group naming a
module (or a function) with ``register(top: Parser) -> None``, e.g. in its pyproject.toml::

    [project.entry-points."ckpt_ha.cli"]
    lab = "ckpt_ha.lab.cli"

which is how the lab's stack commands (`ckpt_ha.lab.cli`) join: the product never imports the
lab.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from ckpt_ha.cli import (
    checkpoints,
    completion,
    dead_letters,
    jobs,
    owners,
    policy,
    registry,
    restores,
    retention,
    serve,
    status,
    streams,
    tiers,
)
from ckpt_ha.cli.arguments import DISTRIBUTION, Parser, UsageError, VersionAction, version

__all__ = ["DISTRIBUTION", "UsageError", "build_parser", "version"]

COMMAND_MODULES: tuple[Any, ...] = (
    serve, status, checkpoints, registry, streams, restores, jobs, dead_letters, owners,
    policy, retention, tiers, completion,
)  # fmt: skip
"""The product's command modules, in the order `ckpt-ha --help` lists their commands."""

ENTRY_POINT_GROUP = "ckpt_ha.cli"
"""Where installed distributions advertise command modules of their own."""

Register = Callable[[Parser], None]


def registrars() -> list[Register]:
    """Every command module's `register`: the product's, then the installed distributions'."""
    found: list[Register] = [m.register for m in COMMAND_MODULES]
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry.load()
        register: Register = getattr(loaded, "register", loaded)
        if register not in found:
            found.append(register)
    return found


def build_parser() -> Parser:
    """The whole command line: every command, flag and help text, with its handler
    (``args.handler``)."""
    top = Parser(prog="ckpt-ha", description="Make ML-training checkpoints really recoverable.")
    top.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    top.add_argument(
        "--context",
        metavar="NAME",
        help="the platform to talk to: a context of $CKPT_HA_HOME/contexts.toml (default: "
        "$CKPT_HA_CONTEXT, else the file's current; docs/CLI.md#contexts)",
    )
    top.commands(dest="command", required=True)
    for register in registrars():
        register(top)
    return top
