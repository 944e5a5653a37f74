from __future__ import annotations

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class RetentionJanitorSettings(ServiceSettings):
    """The shared settings plus the retention period. Tiers and their rules are in
    `ckpt_ha.core.tiers`."""

    retention_interval_s: float = Field(default=600.0, ge=0)
    """Seconds between full retention rounds (0: only on ``checkpoint.registered``)."""
    state_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    """How long a restore plan without a verdict keeps protecting its checkpoint after the last
    event about it (set it as the restore-coordinator has it)."""
