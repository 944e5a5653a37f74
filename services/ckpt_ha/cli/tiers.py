"""`ckpt-ha tier set|show`: a job's protection tier (R13) and the tier table."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import ACTOR_HELP, add_json, text

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser


def register(top: Parser) -> None:
    ti = top.command("tier", help="a job's protection tier")
    ts = ti.command("set", help="record an explicit tier choice for a job", handler=cmd_set)
    ts.add_argument("--job", required=True, type=text)
    ts.add_argument("tier", type=text)
    ts.add_argument("--reason", required=True, type=text)
    ts.add_argument("--actor", type=text, help=ACTOR_HELP)
    add_json(ts)
    tsh = ti.command(
        "show", help="a job's tier, where it comes from, and the tier table", handler=cmd_show
    )
    tsh.add_argument("--job")
    add_json(tsh)


def cmd_set(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import tiers

    settings = context.settings(env, home)
    actor = context.actor(args, env)

    async def act() -> tiers.TierChange:
        async with context.registry(settings) as registry, context.publisher(settings) as pub:
            return await tiers.choose(
                registry,
                pub,
                args.job,
                args.tier,
                reason=args.reason,
                actor=actor,
                now=datetime.now(UTC),
            )

    change = context.run(settings, act)
    before, chosen = change.before, change.chosen
    if args.json:
        print(chosen.model_dump_json(indent=2))
    else:
        print(
            f"job {args.job}: tier {before.tier.name} ({before.source}) -> {chosen.tier}"
            f" by {chosen.actor} at {chosen.at.isoformat()}: {chosen.reason}"
        )
    return 0


def cmd_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.core.tiers import span
    from ckpt_ha.ops import tiers

    if args.job is None:
        table = tiers.table()
        if args.json:
            print(render.dumps(table))
            return 0
        rows = [
            [span(v) if k.endswith("_s") and isinstance(v, float) else ("-" if v is None else v)
             for k, v in row.items()]
            for row in table
        ]  # fmt: skip
        print(render.table([k.removesuffix("_s") for k in table[0]], rows))
        return 0
    settings = context.settings(env, home)

    async def query() -> tiers.JobTier:
        async with context.registry(settings) as registry:
            return await tiers.of_job(registry, args.job)

    found = context.run(settings, query)
    choice, log = found.choice, found.log
    if args.json:
        doc = {
            "job": args.job,
            "tier": choice.tier.name,
            "source": choice.source,
            "detail": choice.detail,
            "policy": choice.tier.policy(),
            "log": [e.model_dump(mode="json") for e in log],
        }
        print(render.dumps(doc))
        return 0
    print(f"job {args.job}: tier {choice.tier.name} ({choice.source}: {choice.detail})")
    print(f"policy: {choice.tier.policy()}")
    if log:
        print(
            render.table(
                ["AT", "TIER", "ACTOR", "REASON"],
                [(e.at.isoformat(), e.tier, e.actor, e.reason) for e in log],
            )
        )
    return 0
