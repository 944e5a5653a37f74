"""Composition root of the integrity-checker process.

Verifies committed checkpoints (manifest, sizes, checksums, format checks) before anyone
restores them, and tags the ones that fail into quarantine.
"""

from __future__ import annotations

from faststream import FastStream

from contracts.subjects import event_filter
from services.integrity_checker.handlers import IntegrityHandlers
from services.integrity_checker.settings import IntegrityCheckerSettings
from services.shared.clock import Clock, utc_now
from services.shared.service import Service, new_service
from services.shared.storage import open_store

NAME = "integrity-checker"


def build(settings: IntegrityCheckerSettings, clock: Clock = utc_now) -> Service:
    svc = new_service(NAME, settings)
    handlers = IntegrityHandlers(
        open_store(settings.storage_root), svc.bus, clock, settings.checksum
    )
    svc.bus.consumer(
        "committed",
        event_filter(svc.bus.cfg.prefix, "checkpoint.committed"),
        description="Verifies each committed checkpoint and publishes verified or corrupt.",
    )(handlers.on_committed)
    return svc.finish(
        title="ckpt-ha integrity-checker",
        description=(
            "Verifies committed checkpoints (manifest, sizes, checksums, format checks) "
            "before anyone restores them."
        ),
    )


def asyncapi_app() -> FastStream:
    app = build(IntegrityCheckerSettings.model_construct()).app
    assert app is not None
    return app
