"""`ckpt-ha registry rebuild`, `dead-letters` and `streams`: the registry replaced from the event
log, what the services could not process, and the streams themselves (operator only)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from ckpt_ha.cli import context, render


def cmd_registry_rebuild(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.rebuild import RebuildReport, rebuild_registry
    from ckpt_ha.storage import key_for_uri, open_store

    settings = context.settings(env, home)
    key_of = partial(key_for_uri, open_store(settings.storage_root))

    async def run() -> RebuildReport:
        async with context.registry(settings) as registry:
            return await rebuild_registry(registry, settings.bus(), key_of, clear=args.clear)

    report = context.run(settings, run)
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(report.skipped.items())) or "none"
    print(
        f"read {report.read} checkpoint events: applied {report.applied}, "
        f"duplicates {report.duplicates}, skipped {skipped}"
    )
    return 0


def cmd_dead_letters(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    import nats

    from ckpt_ha.ops import dead_letters

    settings = context.settings(env, home)

    async def read() -> list[dead_letters.DeadLetter]:
        cfg = settings.bus()
        nc = await nats.connect(
            cfg.url, **cfg.connect_options(), **cfg.connection_policy(lasting=False)
        )
        try:
            return await dead_letters.newest(
                nc.jetstream(), settings.dead_letter_stream, args.limit
            )
        finally:
            await nc.close()

    letters = context.run(settings, read)
    if args.json:
        print(render.dumps([d.to_json() for d in letters]))
    elif not letters:
        print("no dead letters")
    else:
        print(
            render.table(
                ["SEQ", "CONSUMER", "CODE", "DELIVERIES", "SUBJECT", "ERROR"],
                [
                    (d.seq, d.consumer, d.code, d.deliveries, d.subject, str(d.error)[:80])
                    for d in letters
                ],
            )
        )
    return 0


def cmd_streams_provision(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.streams import provision_streams

    settings = context.settings(env, home)
    for line in context.run(settings, lambda: provision_streams(settings.bus())):
        print(line)
    return 0


def cmd_streams_check(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.streams import check_streams

    settings = context.settings(env, home)
    context.run(settings, lambda: check_streams(settings.bus()))
    print(f"{settings.events_stream} and {settings.dead_letter_stream}: as required")
    return 0
