"""Retention by tier (R6, R13), as a dry run: what the janitor would expire or delete now, and
what protects what. The same read and the same plan a real round carries out."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.retention_janitor.domain import Action, Decision
from ckpt_ha.retention_janitor.handlers import dry_run


async def plan(registry: Registry, *, now: datetime, job_id: str | None = None) -> list[Decision]:
    return await dry_run(registry, now, [job_id] if job_id else None)


def notable(decisions: Sequence[Decision]) -> list[Decision]:
    """What an operator must see: every expiry or deletion, and what a protection alone keeps."""
    return [d for d in decisions if d.action is not Action.KEEP or d.protected_by]
