from __future__ import annotations

from typing import Literal

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class IntegrityCheckerSettings(ServiceSettings):
    """``CKPT_HA_CHECKSUM``: xxh3_64 (default, storage speed) or sha256 (tamper-evident).
    ``CKPT_HA_SCRUB_INTERVAL_S``: how often every valid checkpoint is re-verified against the
    checksums recorded when it was verified (0 turns the scrub off)."""

    checksum: Literal["xxh3_64", "sha256"] = "xxh3_64"
    scrub_interval_s: float = Field(default=3600.0, ge=0)
