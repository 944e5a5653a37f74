"""Composition root of the retention-janitor process.

Expires and deletes checkpoints by tier, never one that something still references.
Its consumers arrive with its logic; until then it runs with health and metrics only.
"""

from __future__ import annotations

from faststream import FastStream

from services.retention_janitor.settings import RetentionJanitorSettings
from services.shared.service import Service, new_service

NAME = "retention-janitor"


def build(settings: RetentionJanitorSettings) -> Service:
    return new_service(NAME, settings).finish(
        title="ckpt-ha retention-janitor",
        description=(
            "Expires and deletes checkpoints by tier, never one that something still references."
        ),
    )


def asyncapi_app() -> FastStream:
    app = build(RetentionJanitorSettings.model_construct()).app
    assert app is not None
    return app
