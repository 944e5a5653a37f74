"""`ckpt-ha owner transfer|show`: which project owns a job's checkpoints (R5)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import ACTOR_HELP, add_json, text
from ckpt_ha.cli.errors import CommandError

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.runtime.settings import ServiceSettings


def register(top: Parser) -> None:
    ow = top.command("owner", help="which project owns a job's checkpoints")
    tr = ow.command(
        "transfer", help="move jobs from one project to another (recorded)", handler=cmd_transfer
    )
    tr.add_argument("--from", dest="from_project", type=text, help="the current owner")
    tr.add_argument("--to", dest="to_project", required=True, type=text)
    tr.add_argument("--job", action="append", type=text, help="only these jobs (repeatable)")
    tr.add_argument("--reason", required=True, type=text)
    tr.add_argument("--actor", type=text, help=ACTOR_HELP)
    add_json(tr)
    osh = ow.command(
        "show",
        help="a job's owner and its ownership log, or the jobs a project owns",
        handler=cmd_show,
    )
    which = osh.add_mutually_exclusive_group(required=True)
    which.add_argument("--job")
    which.add_argument("--project", help="every job the project owns, deleted ones included")
    add_json(osh)


def cmd_transfer(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import owners

    if args.from_project is None and not args.job:
        raise CommandError("give --from PROJECT, or --job J for jobs that have no project yet")
    settings = context.settings(env, home)
    actor = context.actor(args, env)

    async def act() -> dict[str, str | None]:
        async with context.registry(settings) as registry, context.publisher(settings) as pub:
            return await owners.transfer(
                registry,
                pub,
                from_project=args.from_project,
                to_project=args.to_project,
                jobs=args.job,
                reason=args.reason,
                actor=actor,
                now=datetime.now(UTC),
            )

    now = context.run(settings, act)
    if args.json:
        print(render.dumps({"transferred": now, "to": args.to_project}))
    else:
        for job, owner in sorted(now.items()):
            print(f"{job}: {args.from_project or 'no project'} -> {owner} (by {actor})")
    return 0


def cmd_show(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import owners

    settings = context.settings(env, home)
    if args.project is not None:
        return _project_show(args, settings)

    async def query() -> owners.JobOwner:
        async with context.registry(settings) as registry:
            return await owners.of_job(registry, args.job)

    found = context.run(settings, query)
    if args.json:
        log = [e.model_dump(mode="json") for e in found.log]
        print(render.dumps({"job": args.job, "owner": found.owner, "log": log}))
        return 0
    print(f"job {args.job}: owned by {found.owner or 'no project'}")
    if found.log:
        print(
            render.table(
                ["AT", "FROM", "TO", "ACTOR", "REASON"],
                [
                    (e.at.isoformat(), e.from_project or "-", e.to_project, e.actor, e.reason)
                    for e in found.log
                ],
            )
        )
    return 0


def _project_show(args: argparse.Namespace, settings: ServiceSettings) -> int:
    from ckpt_ha.ops import owners

    async def query() -> list[owners.ProjectJob]:
        async with context.registry(settings) as registry:
            return await owners.of_project(registry, args.project)

    jobs = context.run(settings, query)
    if args.json:
        print(render.dumps({"project": args.project, "jobs": [j.to_json() for j in jobs]}))
    elif not jobs:
        print(f"project {args.project} owns no jobs")
    else:
        print(
            render.table(
                ["JOB", "TIER", "LATEST VALID", "CHECKPOINTS"],
                [
                    (j.job_id, j.tier, j.latest_valid or "-",
                     " ".join(f"{k}={v}" for k, v in sorted(j.checkpoints.items())))
                    for j in jobs
                ],
            )
        )  # fmt: skip
    return 0
