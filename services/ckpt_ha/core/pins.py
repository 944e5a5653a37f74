"""R15: what a pin is, as a plain value. The restore-coordinator pins the checkpoint a resume
restores from and the previous valid one; the retention-janitor never removes a pinned
checkpoint. Their one owner in Redis is `ckpt_ha.registry.pins`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pin:
    """R15: a checkpoint a resumed job may still fall back to; retention never removes it."""

    checkpoint_id: str
    reason: str
    plan_id: str
    restored_step: int
    attempt: int
    """The resumed attempt: its own newer valid checkpoint releases the pin."""
