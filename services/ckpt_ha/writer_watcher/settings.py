from __future__ import annotations

from typing import Literal

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class WriterWatcherSettings(ServiceSettings):
    """``CKPT_HA_POLL_INTERVAL_S``: how often the storage root is listed (level-triggered).
    ``CKPT_HA_STALL_TIMEOUT_S``: an incomplete checkpoint unchanged this long has failed.
    ``CKPT_HA_WATCH_MODE``: ``auto`` (inotify on a local filesystem root, polling on S3),
    ``inotify`` (insist), ``poll``. Notifications only wake the scan early; it still decides."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    stall_timeout_s: float = Field(default=300.0, gt=0)
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
