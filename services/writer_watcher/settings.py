from __future__ import annotations

from pydantic import Field

from services.shared.settings import ServiceSettings


class WriterWatcherSettings(ServiceSettings):
    """``CKPT_HA_POLL_INTERVAL_S``: how often the storage root is listed (level-triggered).
    ``CKPT_HA_STALL_TIMEOUT_S``: an incomplete checkpoint unchanged this long has failed."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    stall_timeout_s: float = Field(default=300.0, gt=0)
