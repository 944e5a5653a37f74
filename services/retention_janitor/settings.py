from __future__ import annotations

from services.shared.settings import ServiceSettings


class RetentionJanitorSettings(ServiceSettings):
    """Settings of the retention-janitor process (its own options arrive with its logic)."""
