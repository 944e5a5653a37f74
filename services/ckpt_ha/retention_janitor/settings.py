from __future__ import annotations

from pathlib import Path

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
    tombstone_hot_days: float = Field(default=30.0, ge=0)
    """Days a deleted checkpoint's tombstone stays in the registry (Redis) after its deletion;
    each full round then moves older ones to ``CKPT_HA_TOMBSTONE_ARCHIVE`` (written there
    first, then removed from Redis). ``ckpt-ha retention audit`` reads both. 0: never moved."""
    tombstone_archive: str = Field(default=str(Path.home() / ".ckpt-ha" / "tombstones"))
    """Where tombstones moved out of Redis are kept (a plain path, ``file:///path`` or
    ``s3://bucket/prefix``): durable storage outside ``CKPT_HA_STORAGE_ROOT`` (in a container,
    never its own disk), which the janitor writes and the operator's ``retention audit``
    reads."""
