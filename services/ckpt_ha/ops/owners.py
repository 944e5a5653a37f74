"""Which project owns a job's checkpoints (R5): the owner and its log, a project's jobs, and the
explicit, recorded transfer between projects. The index outlives jobs, archived projects and
departed owners; deleted checkpoints stay as tombstones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord, OwnershipChange
from ckpt_ha.ops import actions, manual
from ckpt_ha.ops.errors import NotRecorded
from ckpt_ha.registry.redis_registry import Registry


@dataclass(frozen=True)
class JobOwner:
    job_id: str
    owner: str | None
    log: list[OwnershipChange]


async def of_job(registry: Registry, job_id: str) -> JobOwner:
    return JobOwner(job_id, await registry.owner(job_id), await registry.owner_log(job_id))


@dataclass(frozen=True)
class ProjectJob:
    """What is left of one of a project's jobs."""

    job_id: str
    tier: str
    checkpoints: dict[str, int]
    """How many checkpoints are in each state."""
    latest_valid: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "tier": self.tier,
            "checkpoints": self.checkpoints,
            "latest_valid": self.latest_valid,
        }


def summarise(job_id: str, tier: str, records: Sequence[CheckpointRecord]) -> ProjectJob:
    """``records`` newest step first (as the registry returns them)."""
    states: dict[str, int] = {}
    for r in records:
        states[r.state.value] = states.get(r.state.value, 0) + 1
    latest = next((r for r in records if r.state is CheckpointState.VALID), None)
    return ProjectJob(job_id, tier, states, latest.checkpoint_id if latest else None)


async def of_project(registry: Registry, project: str) -> list[ProjectJob]:
    """Every job the project owns, deleted ones included."""
    return [
        summarise(job, (await registry.tier_of(job)).tier.name, await registry.by_job(job))
        for job in await registry.jobs_of(project)
    ]


async def transfer(
    registry: Registry,
    publisher: Publisher,
    *,
    from_project: str | None,
    to_project: str,
    jobs: Sequence[str] | None,
    reason: str,
    actor: str,
    now: datetime,
    timeout_s: float = manual.RECORD_WAIT_S,
) -> dict[str, str | None]:
    """Move ``jobs`` (default: every job ``from_project`` owns) to ``to_project``; returns each
    job's owner once the registrar recorded every transfer. The registrar refuses a transfer whose
    job moved meanwhile (it is dead-lettered), so this then times out with `NotRecorded`."""
    if jobs:
        chosen = list(jobs)
    else:
        chosen = await registry.jobs_of(from_project) if from_project is not None else []
    owners = {job: await registry.owner(job) for job in chosen}
    datas = actions.transfer(owners, from_project, to_project, reason, actor)
    event_ids = set(await manual.publish(publisher, datas, now=now))

    async def moved() -> dict[str, str | None] | None:
        logs = {job: await registry.owner_log(job) for job in chosen}
        if event_ids <= {e.event_id for log in logs.values() for e in log}:
            return {job: await registry.owner(job) for job in chosen}
        return None

    done = await manual.until(moved, timeout_s=timeout_s)
    if done is None:
        raise NotRecorded(
            "the transfer",
            timeout_s,
            "see `ckpt-ha dead-letters`: a job moved meanwhile is refused there",
        )
    return done
