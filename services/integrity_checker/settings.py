from __future__ import annotations

from services.shared.settings import ServiceSettings


class IntegrityCheckerSettings(ServiceSettings):
    """Settings of the integrity-checker process (its own options arrive with its logic)."""
