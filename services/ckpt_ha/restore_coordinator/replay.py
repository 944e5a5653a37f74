"""The restore-coordinator's state and pins rebuilt from the stream (``ckpt-ha registry
rebuild``, `ckpt_ha.ops.rebuild`): every event through the coordinator's own projection, on the
events' clock (`RedisRestores`, ``replaying``), so state the live coordinator let expire is not
brought back. A composition entry point, like `app`: the operation that rebuilds the registry
builds this and never reaches the coordinator's store or projection itself.
"""

from __future__ import annotations

from datetime import datetime

import redis.asyncio as aioredis

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.registry.pins import RedisPins
from ckpt_ha.restore_coordinator.ports import CheckpointReads
from ckpt_ha.restore_coordinator.projection import RestoreProjection
from ckpt_ha.restore_coordinator.store import RedisRestores
from ckpt_ha.restore_coordinator.store.job_index import RedisJobIndex


class RestoreReplay:
    """The restore-coordinator's state and pins, replayed on the events' clock."""

    def __init__(
        self,
        state: RedisRestores,
        pins: RedisPins,
        registry: CheckpointReads,
        jobs: RedisJobIndex,
    ) -> None:
        self.state = state
        self.projection = RestoreProjection(state, pins, registry)
        self.jobs = jobs
        """The job index (`store.job_index`), under the coordinator's key space: cleared and
        replayed with the rest of its state."""

    async def clear(self) -> int:
        """Delete the coordinator's key space (before the replay; the coordinator is stopped)."""
        return await self.state.clear()

    async def apply(self, event: Envelope[EventData]) -> None:
        await self.jobs.record([event])  # as its own consumer: whatever the projection says
        await self.state.replay_to(event.time)
        await self.projection.apply(event)

    async def finish(self, now: datetime) -> None:
        await self.state.finish_replay(now)


def restore_replay(
    client: aioredis.Redis,
    prefix: str,
    pins: RedisPins,
    registry: CheckpointReads,
    *,
    trajectory_limit: int,
    ttl_s: int,
) -> RestoreReplay:
    """A replay into the coordinator's key space under ``prefix``, trimmed and expiring as the
    live coordinator's (its ``CKPT_HA_TRAJECTORY_LIMIT``, ``CKPT_HA_STATE_TTL_S``)."""
    state = RedisRestores(
        client,
        prefix,
        pins=pins,
        trajectory_limit=trajectory_limit,
        ttl_s=ttl_s,
        replaying=True,
    )
    return RestoreReplay(state, pins, registry, RedisJobIndex(client, prefix))
