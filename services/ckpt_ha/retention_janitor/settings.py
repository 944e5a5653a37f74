from __future__ import annotations

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class RetentionJanitorSettings(ServiceSettings):
    """``CKPT_HA_RETENTION_INTERVAL_S``: seconds between full retention rounds (0: only on
    ``checkpoint.registered``). Tiers and their rules are in `ckpt_ha.core.tiers`."""

    retention_interval_s: float = Field(default=600.0, ge=0)
