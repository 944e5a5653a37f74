"""`ckpt-ha registry rebuild`: the registry replaced from the event log. Refused while the
registry's writers run (`ckpt_ha.ops.platform.writers_running`); with `--clear` it shows what it
would delete and asks (`ckpt_ha.cli.confirm`)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, progress, render
from ckpt_ha.cli.arguments import add_json, add_progress
from ckpt_ha.cli.confirm import add_confirmation, confirm
from ckpt_ha.cli.errors import CommandError, Exit

if TYPE_CHECKING:
    from ckpt_ha.cli.arguments import Parser


def register(top: Parser) -> None:
    reg = top.command("registry", help="registry maintenance")
    rb = reg.command(
        "rebuild",
        help="replay the event stream into an empty registry: checkpoint records, declared "
        "tiers, the restore-coordinator's state and pins",
        handler=cmd_rebuild,
    )
    rb.add_argument(
        "--clear",
        action="store_true",
        help="first delete everything the rebuild restores (the reconcile log is kept); asks "
        "first unless --yes",
    )
    rb.add_argument(
        "--accept-new-stream",
        action="store_true",
        help="rebuild from an event stream that is not the one the registry was built from "
        "(deleted and created again): only when it is meant to start afresh",
    )
    add_confirmation(rb)
    add_json(rb)
    add_progress(rb)


def cmd_rebuild(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.ops.platform import writers_running
    from ckpt_ha.ops.rebuild import RebuildPreview, RebuildReport, preview, rebuild_registry
    from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
    from ckpt_ha.storage import key_for_uri, open_store

    # The coordinator's settings: its state is replayed trimmed and expiring as it keeps it.
    settings = context.settings_of(RestoreCoordinatorSettings, env, home, "operator")
    key_of = partial(key_for_uri, open_store(settings.storage_root))

    async def look() -> tuple[dict[str, list[str]], RebuildPreview]:
        running = await writers_running(settings.bus())
        async with context.registry(settings) as registry:
            found = await preview(
                registry, settings.bus(), clear=args.clear, accept_new_stream=args.accept_new_stream
            )
        return running, found

    running, found = context.run(settings, look)
    refusals = [_writers_refusal(running)] if running else []
    refusals += found.refusals
    plan = [
        f"registry rebuild of prefix {settings.registry_prefix!r} from stream "
        f"{settings.events_stream}: {found.keys} key(s) under the prefix now"
        + (", deleted first (the reconcile log is kept)" if args.clear and found.keys else ""),
        *(f"refused: {why}" for why in refusals),
    ]
    if args.dry_run:
        if args.json:
            print(render.dumps({"dry_run": True, "keys": found.keys, "clear": args.clear,
                                "refusals": refusals}))  # fmt: skip
        else:
            print("\n".join(plan))
        return Exit.NO if refusals else Exit.OK
    if refusals:
        raise CommandError(refusals[0])
    if args.clear and found.keys:
        confirm(args, plan, f"delete {found.keys} key(s) and rebuild them from the stream?")

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


def _writers_refusal(running: dict[str, list[str]]) -> str:
    seen = "; ".join(f"{svc} ({', '.join(durables)})" for svc, durables in running.items())
    return (
        f"the registry's writers run: {seen} pull from their consumers; stop the registrar, "
        "the restore-coordinator and the retention-janitor first (docs/RUNBOOK.md#rebuild-registry)"
    )
