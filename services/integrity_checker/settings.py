from __future__ import annotations

from typing import Literal

from services.shared.settings import ServiceSettings


class IntegrityCheckerSettings(ServiceSettings):
    """``CKPT_HA_CHECKSUM``: xxh3_64 (default, storage speed) or sha256 (tamper-evident)."""

    checksum: Literal["xxh3_64", "sha256"] = "xxh3_64"
