"""`ckpt-ha registry rebuild`: the registry replaced from the event log."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.cli import context, progress, render
from ckpt_ha.cli.arguments import add_json, add_progress

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
        help="first delete everything the rebuild restores (the reconcile log is kept)",
    )
    rb.add_argument(
        "--accept-new-stream",
        action="store_true",
        help="rebuild from an event stream that is not the one the registry was built from "
        "(deleted and created again): only when it is meant to start afresh",
    )
    add_json(rb)
    add_progress(rb)


def cmd_rebuild(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
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
