"""`ckpt-ha dead-letter list|replay` (also spelled `dead-letters`, which alone lists): what the
services could not process, and its replay after a fix."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, render
from ckpt_ha.cli.arguments import ACTOR_HELP, add_json, code, count, since, text
from ckpt_ha.cli.confirm import add_confirmation, confirm
from ckpt_ha.core.clock import utc_now

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.ops.dead_letters import DeadLetter
    from ckpt_ha.runtime.settings import ServiceSettings


def register(top: Parser) -> None:
    # The noun alone lists too (its first spelling, `dead-letters [--limit N]`).
    dlq = top.command("dead-letter", help="list dead-lettered messages and why", handler=cmd_list)
    top.alias("dead-letters", dlq)
    _list_arguments(dlq)
    dlq.commands(required=False)
    _list_arguments(dlq.command("list", help="list dead-lettered messages and why",
                                handler=cmd_list))  # fmt: skip
    rp = dlq.command(
        "replay",
        help="after a fix: re-publish dead letters (original bytes and headers), each once",
        description="Re-publishes the selected dead letters that were not replayed before on "
        "their original subjects, and records each replay in the dead-letter stream; running it "
        "again publishes nothing twice. Refusals of who may say what (location_not_owned, "
        "job_mismatch, forged, unsigned, subject_mismatch, outside_storage_root) are never "
        "replayed.",
        handler=cmd_replay,
    )
    rp.add_argument(
        "--reason",
        type=code,
        metavar="CODE",
        help="only dead letters with this error code (max_deliver, not_ready, ...)",
    )
    rp.add_argument(
        "--since",
        type=since,
        metavar="T",
        help="only those dead-lettered since T: an ISO 8601 time (UTC unless it names a zone) "
        "or an age such as 30m, 2h, 1d",
    )
    rp.add_argument(
        "--consumer",
        type=text,
        metavar="C",
        help="only those refused by this durable consumer (registrar--checkpoints)",
    )
    rp.add_argument("--dry-run", action="store_true", help="show what would be replayed")
    rp.add_argument("--actor", type=text, help=ACTOR_HELP)
    add_confirmation(rp, dry_run=False)
    add_json(rp)


def _list_arguments(p: Parser) -> None:
    p.add_argument("--limit", type=count, default=50)
    add_json(p)


def cmd_list(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import dead_letters

    settings = context.settings(env, home)

    async def read() -> list[dead_letters.DeadLetter]:
        async with _jetstream(settings) as js:
            return await dead_letters.newest(js, settings.dead_letter_stream, args.limit)

    letters = context.run(settings, read)
    if args.json:
        print(render.dumps([d.to_json() for d in letters]))
    elif not letters:
        print("no dead letters")
    else:
        print(_letters_table(letters))
    return 0


def cmd_replay(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import dead_letters

    settings = context.settings(env, home)
    who = context.actor(args, env)
    selection = dead_letters.Selection(code=args.reason, since=args.since, consumer=args.consumer)

    def replay(dry_run: bool) -> dead_letters.ReplayReport:
        async def go() -> dead_letters.ReplayReport:
            async with _jetstream(settings) as js:
                return await dead_letters.replay(
                    js, settings.bus(), selection, actor=who, now=utc_now(), dry_run=dry_run
                )

        return context.run(settings, go)

    if not args.dry_run and not args.yes:
        # What would be re-published, shown before asking; the replay selects again and still
        # publishes each letter at most once.
        planned = replay(dry_run=True)
        if planned.replayed:
            what = [f"would replay {len(planned.replayed)} dead letter(s):",
                    _letters_table(planned.replayed)]  # fmt: skip
            confirm(args, what, f"re-publish {len(planned.replayed)} dead letter(s)?")
    report = replay(dry_run=args.dry_run)
    if args.json:
        print(render.dumps(report.to_json()))
        return 0
    verb = "would replay" if report.dry_run else "replayed"
    if report.replayed:
        print(f"{verb} {len(report.replayed)} dead letter(s):")
        print(_letters_table(report.replayed))
    else:
        print("nothing to replay")
    if report.already:
        print(f"already replayed before: {len(report.already)} (each is published once)")
    if report.never:
        codes = ", ".join(sorted({str(d.code) for d in report.never}))
        print(
            f"never replayed: {len(report.never)} ({codes}): refusals of who may say what, "
            "see docs/RUNBOOK.md#dead-letters"
        )
    return 0


def _letters_table(letters: Sequence[DeadLetter]) -> str:
    rows = [
        (d.seq, d.consumer, d.code, d.deliveries, d.subject, d.replayed_as or "-", str(d.error))
        for d in letters
    ]
    return render.table(
        ["SEQ", "CONSUMER", "CODE", "DELIVERIES", "SUBJECT", "REPLAYED AS", "ERROR"],
        [(*row[:-1], row[-1][:80]) for row in rows],
    )


@asynccontextmanager
async def _jetstream(settings: ServiceSettings) -> AsyncIterator[JetStreamContext]:
    """JetStream on a connection of its own, as the settings' principal."""
    import nats

    cfg = settings.bus()
    nc = await nats.connect(
        cfg.servers, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
    )
    try:
        yield nc.jetstream(timeout=cfg.request_timeout_s)
    finally:
        await nc.close()
