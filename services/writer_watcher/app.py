"""Composition root of the writer-watcher process.

Turns checkpoint writes on storage into checkpoint.writing / committed
/ write_failed events.
Its consumers arrive with its logic; until then it runs with health and metrics only.
"""

from __future__ import annotations

from faststream import FastStream

from services.shared.service import Service, new_service
from services.writer_watcher.settings import WriterWatcherSettings

NAME = "writer-watcher"


def build(settings: WriterWatcherSettings) -> Service:
    return new_service(NAME, settings).finish(
        title="ckpt-ha writer-watcher",
        description=(
            "Turns checkpoint writes on storage into "
            "checkpoint.writing / committed / write_failed events."
        ),
    )


def asyncapi_app() -> FastStream:
    app = build(WriterWatcherSettings.model_construct()).app
    assert app is not None
    return app
