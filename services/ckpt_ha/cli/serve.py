"""`ckpt-ha service run NAME` (also spelled `serve NAME`): the five services by name, each with
its composition root (settings class, app factory) and its AsyncAPI app. The composition side
owns this table, so that the runtime package never imports a service; the plain names are
`ckpt_ha.runtime.catalog`."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_ha.runtime.catalog import SERVICE_NAMES

if TYPE_CHECKING:
    from faststream import FastStream

    from ckpt_ha.cli.arguments import Parser
    from ckpt_ha.runtime.service import Service
    from ckpt_ha.runtime.settings import ServiceSettings


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    settings: type[ServiceSettings]
    build: Callable[[ServiceSettings], Service]
    asyncapi_app: Callable[[], FastStream]


def entries() -> dict[str, ServiceEntry]:
    from ckpt_ha.integrity_checker import app as integrity_checker
    from ckpt_ha.integrity_checker.settings import IntegrityCheckerSettings
    from ckpt_ha.registrar import app as registrar
    from ckpt_ha.registrar.settings import RegistrarSettings
    from ckpt_ha.restore_coordinator import app as restore_coordinator
    from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings
    from ckpt_ha.retention_janitor import app as retention_janitor
    from ckpt_ha.retention_janitor.settings import RetentionJanitorSettings
    from ckpt_ha.writer_watcher import app as writer_watcher
    from ckpt_ha.writer_watcher.settings import WriterWatcherSettings

    table: list[tuple[str, type[ServiceSettings], Callable[..., Service], Callable[[], FastStream]]]
    table = [
        (
            writer_watcher.NAME,
            WriterWatcherSettings,
            writer_watcher.build,
            writer_watcher.asyncapi_app,
        ),
        (
            integrity_checker.NAME,
            IntegrityCheckerSettings,
            integrity_checker.build,
            integrity_checker.asyncapi_app,
        ),
        (registrar.NAME, RegistrarSettings, registrar.build, registrar.asyncapi_app),
        (
            restore_coordinator.NAME,
            RestoreCoordinatorSettings,
            restore_coordinator.build,
            restore_coordinator.asyncapi_app,
        ),
        (
            retention_janitor.NAME,
            RetentionJanitorSettings,
            retention_janitor.build,
            retention_janitor.asyncapi_app,
        ),
    ]
    return {name: ServiceEntry(name, s, b, a) for name, s, b, a in table}


def cmd_serve(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    from ckpt_ha.bus.streams import StreamMisconfigured
    from ckpt_ha.cli.errors import CommandError

    entry = entries()[args.name]
    try:
        settings = entry.settings()
        # Without a job-signing key any job's credentials could speak for every job: refuse.
        settings.require_signing_keys()
        svc = entry.build(settings)
    except ValueError as exc:  # settings that fail validation, a missing signing key
        raise CommandError(f"{args.name}: {exc}") from None
    try:
        asyncio.run(svc.run(settings))
    except StreamMisconfigured as exc:
        raise CommandError(f"{args.name}: {exc}") from None
    return 0


def register(top: Parser) -> None:
    service = top.command("service", help="the services of ckpt-ha")
    run = service.command("run", help="run one service process", handler=cmd_serve)
    run.add_argument("name", choices=SERVICE_NAMES)
    run.set_defaults(default_log_level="INFO")  # a service logs what it does; commands only warn
    top.alias("serve", run)
