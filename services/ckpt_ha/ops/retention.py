"""Retention by tier (R6, R13), as a dry run: what the janitor would expire or delete now, and
what protects what. The same read and the same plan a real round carries out: the registry, and
the janitor's own view of the restores that reference checkpoints (its plans and pins, kept
from the events), not the restore-coordinator's state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ckpt_ha.retention_janitor.api import (
    Action,
    Decision,
    ResumeView,
    RetentionRegistry,
    plan_round,
)


async def plan(
    registry: RetentionRegistry,
    resumes: ResumeView,
    *,
    now: datetime,
    job_id: str | None = None,
) -> list[Decision]:
    return await plan_round(registry, resumes, now, [job_id] if job_id else None)


def notable(decisions: Sequence[Decision]) -> list[Decision]:
    """What an operator must see: every expiry or deletion, and what a protection alone keeps."""
    return [d for d in decisions if d.action is not Action.KEEP or d.protected_by]
