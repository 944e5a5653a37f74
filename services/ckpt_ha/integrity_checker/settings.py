from __future__ import annotations

from typing import Literal

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class IntegrityCheckerSettings(ServiceSettings):
    """The shared settings plus the checksum, the scrub and the re-verification of checkpoints
    whose verdict an outage lost."""

    checksum: Literal["xxh3_64", "sha256"] = "xxh3_64"
    """Checksum for formats that carry none: ``xxh3_64`` (storage speed) or ``sha256``
    (tamper-evident)."""
    scrub_interval_s: float = Field(default=3600.0, ge=0)
    """How often every valid checkpoint is re-verified against the checksums recorded when it
    was verified (0 turns the scrub off)."""
    verify_deadline_s: float = Field(default=1800.0, gt=0)
    """A checkpoint pending verification for longer than this lost its verdict (an outage
    longer than the retry budget) and is verified again."""
    reconcile_interval_s: float = Field(default=300.0, ge=0)
    """How often the registry is read for checkpoints past their deadline (0 turns it off)."""
