from __future__ import annotations

from typing import Literal

from pydantic import Field

from ckpt_ha.runtime.settings import ServiceSettings


class IntegrityCheckerSettings(ServiceSettings):
    """The shared settings plus the checksum, the scrub, the copies of replicating tiers and the
    re-verification of checkpoints whose verdict an outage lost."""

    checksum: Literal["xxh3_64", "sha256"] = "xxh3_64"
    """Checksum for formats that carry none: ``xxh3_64`` (storage speed) or ``sha256``
    (tamper-evident)."""
    scrub_interval_s: float = Field(default=3600.0, ge=0)
    """How often every valid checkpoint is re-verified against the checksums recorded when it
    was verified (0 turns the scrub off)."""
    scrub_bytes_per_s: int = Field(default=100 * 2**20, ge=0)
    """The scrub's read budget on the storage root, in bytes per second (0: unlimited; default
    100 MiB/s), so that re-reading every valid byte never takes more than this share from
    training's reads. A round that cannot read everything within ``scrub_interval_s`` at this
    rate stops there and the next round continues where it stopped. Verification of freshly
    committed checkpoints is not budgeted: it decides when a checkpoint may be restored."""
    scrub_burst_bytes: int = Field(default=8 * 2**20, gt=0)
    """How many bytes the scrub may read at once above its rate after it was idle (the token
    bucket's size; default 8 MiB). Over any ``t`` seconds the scrub reads at most
    ``scrub_burst_bytes + scrub_bytes_per_s * t``."""
    verify_deadline_s: float = Field(default=1800.0, gt=0)
    """A checkpoint pending verification for longer than this lost its verdict (an outage
    longer than the retry budget) and is verified again. Keep it above JetStream's duplicate
    window (120 s): the verdict of a re-drive has the lost one's id, and within the window the
    stream drops it as a duplicate of a verdict the registrar may have dead-lettered."""
    replica_roots: dict[str, str] = Field(default_factory=dict)
    """Where the copies of each replicating tier go: tier name → root (``s3://bucket/prefix``
    or a path), as JSON, e.g. ``{"critical": "s3://ckpt-copies/train"}``. Each valid checkpoint
    of a job on such a tier is copied to the same key under that root and verified there. A tier
    that replicates without a root here gets no copies (say so: `ckpt_ha_replication_lag_seconds`
    stays 0 for it)."""
    copy_interval_s: float = Field(default=30.0, ge=0)
    """How often the valid checkpoints are looked at for missing copies (0 turns copies off)."""
    copy_bytes_per_s: int = Field(default=200 * 2**20, ge=0)
    """The copies' read budget, in bytes per second, over the primary's files and the copy's
    verification (0: unlimited; default 200 MiB/s), so copies never take more than this share
    of the storage's bandwidth from training."""
    copy_burst_bytes: int = Field(default=8 * 2**20, gt=0)
    """How many bytes the copies may read at once above their rate after being idle."""
    reconcile_interval_s: float = Field(default=300.0, ge=0)
    """How often the registry is read for checkpoints past their deadline (0 turns it off)."""
