from __future__ import annotations

from typing import Literal

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class IntegrityCheckerSettings(ServiceSettings):
    """``CKPT_HA_CHECKSUM``: xxh3_64 (default, storage speed) or sha256 (tamper-evident).
    ``CKPT_HA_SCRUB_INTERVAL_S``: how often every valid checkpoint is re-verified against the
    checksums recorded when it was verified (0 turns the scrub off).
    ``CKPT_HA_VERIFY_DEADLINE_S``: a checkpoint pending verification for longer than this lost
    its verdict (an outage longer than the retry budget) and is verified again.
    ``CKPT_HA_RECONCILE_INTERVAL_S``: how often the reconciler looks for such checkpoints (0 turns
    it off)."""

    checksum: Literal["xxh3_64", "sha256"] = "xxh3_64"
    scrub_interval_s: float = Field(default=3600.0, ge=0)
    verify_deadline_s: float = Field(default=1800.0, gt=0)
    reconcile_interval_s: float = Field(default=300.0, ge=0)
