from __future__ import annotations

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class RetentionJanitorSettings(ServiceSettings):
    """The shared settings plus the retention period. Tiers and their rules are in
    `ckpt_ha.core.tiers`."""

    retention_interval_s: float = Field(default=600.0, ge=0)
    """Seconds between full retention rounds (0: only on ``checkpoint.registered``)."""
