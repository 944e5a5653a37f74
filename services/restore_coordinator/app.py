"""Composition root of the restore-coordinator process.

Plans, watches and verifies resumes after job failures.
Its consumers arrive with its logic; until then it runs with health and metrics only.
"""

from __future__ import annotations

from faststream import FastStream

from services.restore_coordinator.settings import RestoreCoordinatorSettings
from services.shared.service import Service, new_service

NAME = "restore-coordinator"


def build(settings: RestoreCoordinatorSettings) -> Service:
    return new_service(NAME, settings).finish(
        title="ckpt-ha restore-coordinator",
        description=("Plans, watches and verifies resumes after job failures."),
    )


def asyncapi_app() -> FastStream:
    app = build(RestoreCoordinatorSettings.model_construct()).app
    assert app is not None
    return app
