from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ckpt_ha.runtime.settings import ServiceSettings


class WriterWatcherSettings(ServiceSettings):
    """``CKPT_HA_POLL_INTERVAL_S``: how often the storage root is listed (level-triggered).
    ``CKPT_HA_STALL_TIMEOUT_S``: an incomplete checkpoint unchanged this long has failed.
    ``CKPT_HA_WATCH_MODE``: ``auto`` (inotify on a local filesystem root, polling on S3),
    ``inotify`` (insist), ``poll``. Notifications only wake the scan early; it still decides.
    ``CKPT_HA_WRITING_DEADLINE_S``: a checkpoint the registry holds as writing for longer than
    this is re-driven (its outcome announced again, or failed when no write of it is left);
    longer than the stall timeout, which decides writes the watcher still follows.
    ``CKPT_HA_RECONCILE_INTERVAL_S``: how often the registry's writing records are read for
    that (0 turns it off)."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    stall_timeout_s: float = Field(default=300.0, gt=0)
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
    writing_deadline_s: float = Field(default=1800.0, gt=0)
    reconcile_interval_s: float = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _deadline_after_stall(self) -> WriterWatcherSettings:
        if self.writing_deadline_s <= self.stall_timeout_s:
            raise ValueError(
                f"CKPT_HA_WRITING_DEADLINE_S ({self.writing_deadline_s:g}) must be longer than "
                f"CKPT_HA_STALL_TIMEOUT_S ({self.stall_timeout_s:g}): a write the watcher still "
                "follows is decided by the stall timeout"
            )
        return self
