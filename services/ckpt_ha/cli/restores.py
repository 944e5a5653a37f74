"""`ckpt-ha restore list --job J` (also spelled `restores --job J`): what the restore-coordinator
decided for a job, and why."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import add_json, text

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser


def register(top: Parser) -> None:
    rs = top.command("restore", help="the restore-coordinator's decisions")
    ls = rs.command(
        "list",
        help="a job's restore decisions: plans with their reasons, escalations with the "
        "differences behind them, load outcomes, continuity",
        handler=cmd_list,
    )
    ls.add_argument("--job", required=True, type=text)
    add_json(ls)
    top.alias("restores", ls)


def cmd_list(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.bus.stream_reader import read_events
    from ckpt_ha.contracts import CATALOG
    from ckpt_ha.contracts.subjects import job_token
    from ckpt_ha.ops import restores

    settings = context.settings(env, home)
    cfg = settings.bus()

    async def read() -> list[restores.Entry]:
        subject = f"{cfg.prefix}.ev.resume.*.*.{job_token(args.job)}"
        events, _ = await read_events(cfg, CATALOG, subject, idle_timeout=2.0)
        return restores.history(events)

    entries = context.run(settings, read)
    if args.json:
        print(render.dumps([e.to_json() for e in entries]))
        return 0
    if not entries:
        print(f"no restore decisions for job {args.job}")
        return 0
    for e in entries:
        print(f"{e.at.isoformat(timespec='seconds')}  {e.kind:<11} {e.summary}")
        for line in e.details:
            print(f"{'':>33}{line}")
    return 0
