"""What the restore-coordinator may do on NATS and Redis (rendered into ``deploy/nats/`` and
``deploy/redis/`` by `ckpt_ha.bus.permissions` and `ckpt_ha.registry.acl`)."""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_ha.bus.access import Principal
from ckpt_ha.registry.access import CONNECT, LEASES, RedisUser
from ckpt_ha.restore_coordinator import api as restores

# `checkpoint.deleted`: the tombstones of a failed attempt's partial writes it reclaims.
NATS = Principal("restore-coordinator", ("resume.planned", "resume.verified", "resume.diverged",
                                         "resume.escalated", "resume.closed",
                                         "checkpoint.quarantined", "checkpoint.deleted",
                                         # `job.failed`: an attempt it declares lost.
                                         "job.failed"),
                 consumers=("started", "failed", "load-failed", "registered", "verified",
                            "loaded", "succeeded", "held", "unheld", "restore-requested",
                            "job-index"),
                 reports=("heartbeat", "progress", "job-index-heartbeat",
                          "job-index-progress"))  # fmt: skip


def key_spaces(prefix: str) -> Mapping[str, str]:
    """Its own key spaces, as its store formats them (`restores.key`)."""
    return {
        "restore-state": restores.key(prefix, "*"),
    }


REDIS = RedisUser(
    "restore-coordinator",
    # Its own memory and the pins; reads a job's records to choose a restore. The heartbeat
    # watches (compare-and-set, the deadlines' sorted set) and the lease of its lost-attempt
    # loop. Its scripts (`store/lua/*.lua`: EVALSHA and SCRIPT LOAD,
    # granted with LEASES) run only commands granted here.
    ("restore-state", "pins", "leases"),
    ("checkpoints", "job-index"),
    (*CONNECT, *LEASES, "get", "set", "mget", "del", "expire", "hset", "hget",
     "hmget", "hgetall", "hdel", "zadd", "zcard", "zpopmin", "zrange", "zrevrange",
     "zremrangebyrank", "zremrangebyscore", "zrem", "zrangebyscore", "zscore", "sadd", "smembers",
     "rpush", "ltrim", "lrange", "multi", "exec", "discard", "incrby"),
    key_spaces=key_spaces,
)  # fmt: skip
