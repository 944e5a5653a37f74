"""R10: what a resume from an older checkpoint costs (the steps to compute again)."""

from __future__ import annotations

from datetime import datetime

from ckpt_ha.restore_coordinator.records import Point


def recompute(
    *,
    checkpoint_step: int,
    checkpoint_at: datetime | None,
    last_progress: Point | None,
    failed_step: int | None,
    failed_at: datetime,
) -> tuple[int, float]:
    """(steps, seconds) lost: from the checkpoint (its step's progress report, else its
    creation time) to the failed attempt's last progress (else the failure itself)."""
    last_step = max(
        [s for s in (failed_step, last_progress.step if last_progress else None) if s is not None],
        default=checkpoint_step,
    )
    steps = max(0, last_step - checkpoint_step)
    end = last_progress.at if last_progress is not None else failed_at
    seconds = max(0.0, (end - checkpoint_at).total_seconds()) if checkpoint_at else 0.0
    return steps, seconds
