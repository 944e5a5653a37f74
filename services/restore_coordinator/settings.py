from __future__ import annotations

from services.shared.settings import ServiceSettings


class RestoreCoordinatorSettings(ServiceSettings):
    """Settings of the restore-coordinator process (its own options arrive with its logic)."""
