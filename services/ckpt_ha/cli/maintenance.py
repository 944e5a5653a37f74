"""`ckpt-ha registry rebuild`, `dead-letters` (and their replay) and `streams`: the registry
replaced from the event log, what the services could not process, and the streams themselves
(operator only)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, progress, render
from ckpt_ha.core.clock import utc_now

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from ckpt_ha.ops.dead_letters import DeadLetter
    from ckpt_ha.runtime.settings import ServiceSettings


def cmd_registry_rebuild(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.rebuild import RebuildReport, rebuild_registry
    from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
    from ckpt_ha.storage import key_for_uri, open_store

    # The coordinator's settings: its state is replayed trimmed and expiring as it keeps it.
    settings = context.settings_of(RestoreCoordinatorSettings, env, home, "operator")
    key_of = partial(key_for_uri, open_store(settings.storage_root))

    async def run(tick: progress.Progress | None) -> RebuildReport:
        async with context.registry(settings) as registry:
            return await rebuild_registry(
                registry,
                settings.bus(),
                key_of,
                clear=args.clear,
                accept_new_stream=args.accept_new_stream,
                trajectory_limit=settings.trajectory_limit,
                state_ttl_s=settings.state_ttl_s,
                progress=tick,
            )

    with progress.reporting(args, "registry rebuild", "events read") as tick:
        report = context.run(settings, lambda: run(tick))
    if args.json:
        print(render.dumps(report.to_json()))
        return 0
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(report.skipped.items())) or "none"
    print(
        f"read {report.read} events: checkpoint events applied {report.applied}, "
        f"duplicates {report.duplicates}; job and resume events replayed {report.replayed}; "
        f"skipped {skipped}"
    )
    return 0


def cmd_dead_letters(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
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


def cmd_dead_letters_replay(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops import dead_letters

    settings = context.settings(env, home)
    who = context.actor(args, env)
    selection = dead_letters.Selection(code=args.reason, since=args.since, consumer=args.consumer)

    async def replay() -> dead_letters.ReplayReport:
        async with _jetstream(settings) as js:
            return await dead_letters.replay(
                js, settings.bus(), selection, actor=who, now=utc_now(), dry_run=args.dry_run
            )

    report = context.run(settings, replay)
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


def cmd_streams_provision(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.streams import provision_streams

    settings = context.settings(env, home)
    lines = context.run(settings, lambda: provision_streams(settings.bus()))
    if args.json:
        print(render.dumps({"changes": list(lines)}))
        return 0
    for line in lines:
        print(line)
    return 0


def cmd_streams_check(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
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
