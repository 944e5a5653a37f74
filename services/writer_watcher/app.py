"""Composition root of the writer-watcher process.

Turns checkpoint writes on storage into checkpoint.writing / committed / write_failed events,
by listing the storage root every few seconds (level-triggered: a restart re-derives the same
facts with the same event ids).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from faststream import FastStream

from services.shared.clock import Clock, utc_now
from services.shared.service import Service, new_service
from services.shared.storage import open_store
from services.writer_watcher.handlers import Watcher
from services.writer_watcher.settings import WriterWatcherSettings

NAME = "writer-watcher"


def build(settings: WriterWatcherSettings, clock: Clock = utc_now) -> Service:
    svc = new_service(NAME, settings).finish(
        title="ckpt-ha writer-watcher",
        description=(
            "Turns checkpoint writes on storage into checkpoint.writing / committed / "
            "write_failed events."
        ),
    )
    watcher = Watcher(
        open_store(settings.storage_root),
        svc.bus,
        clock,
        timedelta(seconds=settings.stall_timeout_s),
    )
    tasks: list[asyncio.Task[None]] = []
    assert svc.app is not None

    @svc.app.after_startup
    async def _start() -> None:
        tasks.append(asyncio.create_task(watcher.run(settings.poll_interval_s)))

    @svc.app.on_shutdown
    async def _stop() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return svc


def asyncapi_app() -> FastStream:
    app = build(WriterWatcherSettings.model_construct()).app
    assert app is not None
    return app
