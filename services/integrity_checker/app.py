"""Composition root of the integrity-checker process.

Verifies committed checkpoints (manifest, sizes, checksums, format checks)
before anyone restores them.
Its consumers arrive with its logic; until then it runs with health and metrics only.
"""

from __future__ import annotations

from faststream import FastStream

from services.integrity_checker.settings import IntegrityCheckerSettings
from services.shared.service import Service, new_service

NAME = "integrity-checker"


def build(settings: IntegrityCheckerSettings) -> Service:
    return new_service(NAME, settings).finish(
        title="ckpt-ha integrity-checker",
        description=(
            "Verifies committed checkpoints (manifest, sizes, checksums, "
            "format checks) before anyone restores them."
        ),
    )


def asyncapi_app() -> FastStream:
    app = build(IntegrityCheckerSettings.model_construct()).app
    assert app is not None
    return app
