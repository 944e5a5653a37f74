"""`ckpt-ha stream provision|check` (also spelled `streams`): the event and dead-letter streams
themselves (operator only)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import add_json, non_negative

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser


def register(top: Parser) -> None:
    sm = top.command("stream", help="the event and dead-letter streams (operator only)")
    top.alias("streams", sm)
    provision = sm.command(
        "provision",
        help="create the streams or bring them to the required configuration; list ckpt-ha's "
        "durable consumers they no longer feed and remove those idle for the grace period",
        handler=cmd_provision,
    )
    provision.add_argument(
        "--obsolete-grace-s",
        type=non_negative,
        default=3600.0,
        metavar="SECONDS",
        help="remove an obsolete durable only once nothing was delivered to it for this long "
        "(default 3600; a later provisioning removes the others)",
    )
    add_json(provision)
    add_json(
        sm.command(
            "check",
            help="exit 0 only if both streams are configured as required",
            handler=cmd_check,
        )
    )


def cmd_provision(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.streams import provision_streams

    settings = context.settings(env, home)
    lines = context.run(
        settings,
        lambda: provision_streams(settings.bus(), obsolete_grace_s=args.obsolete_grace_s),
    )
    if args.json:
        print(render.dumps({"changes": list(lines)}))
        return 0
    for line in lines:
        print(line)
    return 0


def cmd_check(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.streams import check_streams

    settings = context.settings(env, home)
    context.run(settings, lambda: check_streams(settings.bus()))
    names = [settings.events_stream, settings.dead_letter_stream]
    names += [settings.progress_stream] if settings.progress_stream else []
    if args.json:
        print(render.dumps({"streams": names, "as_required": True}))
        return 0
    print(f"{', '.join(names)}: as required")
    return 0
