from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ckpt_ha.runtime.settings import ServiceSettings


class WriterWatcherSettings(ServiceSettings):
    """The shared settings plus how storage is watched and how long a write may take.
    Notifications only wake the scan early; it still decides."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    """How often the storage root is listed (level-triggered)."""
    stall_timeout_s: float = Field(default=300.0, gt=0)
    """An incomplete checkpoint unchanged this long has failed."""
    removal_grace_s: float = Field(default=15.0, gt=0)
    """How long a committed folder may stay short of files, or gone, before the watcher decides:
    gone as a whole is its writer's deletion (a framework's rotation), files missing from a
    folder that stays are damage. Longer than a removal of a large folder takes."""
    full_rescan_interval_s: float = Field(default=300.0, gt=0)
    """With change notifications, a scan lists only the folders they name; the whole root is
    listed this often anyway, so a lost or overflowed notification delays detection by at most
    this long (without notifications, on S3, every scan lists everything)."""
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
    """``auto`` (inotify on a local filesystem root, polling on S3), ``inotify`` (insist) or
    ``poll``."""
    writing_deadline_s: float = Field(default=1800.0, gt=0)
    """A checkpoint the registry holds as writing for longer than this is re-driven (its
    outcome announced again, or failed when no write of it is left); must be longer than the
    stall timeout, which decides writes the watcher still follows."""
    reconcile_interval_s: float = Field(default=300.0, ge=0)
    """How often the registry is read for checkpoints past their deadline (0 turns it off)."""

    @model_validator(mode="after")
    def _deadline_after_stall(self) -> WriterWatcherSettings:
        if self.writing_deadline_s <= self.stall_timeout_s:
            raise ValueError(
                f"CKPT_HA_WRITING_DEADLINE_S ({self.writing_deadline_s:g}) must be longer than "
                f"CKPT_HA_STALL_TIMEOUT_S ({self.stall_timeout_s:g}): a write the watcher still "
                "follows is decided by the stall timeout"
            )
        return self
