"""What the retention-janitor may do on NATS and Redis (rendered into ``deploy/nats/`` and
``deploy/redis/`` by `ckpt_ha.bus.permissions` and `ckpt_ha.registry.acl`)."""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_ha.bus.access import Principal
from ckpt_ha.registry.access import CONNECT, LEASES, RedisUser
from ckpt_ha.retention_janitor import store

# "planned", "verified", "diverged", "released": its own view of what restores reference
# (R6, R15).
NATS = Principal("retention-janitor", ("checkpoint.expired", "checkpoint.deleted"),
                 consumers=("registered", "started", "planned", "verified", "diverged",
                            "released"))  # fmt: skip


def key_spaces(prefix: str) -> Mapping[str, str]:
    """Its own key space, as its store formats it (`store.pattern`)."""
    return {"janitor-view": store.pattern(prefix)}


REDIS = RedisUser(
    "retention-janitor",
    # Reads jobs, records and tiers; records the declared tier; keeps its own view of resumes
    # (never a key of the restore-coordinator's). And the lease of its periodic rounds. Removes
    # archived tombstones from the records and their indexes (`ckpt_ha.registry.eviction`).
    ("tier-declared", "janitor-view", "leases", "checkpoints", "job-index", "state-index",
     "uri-index"),
    ("jobs", "tiers"),
    (*CONNECT, *LEASES, "get", "set", "del", "mget", "smembers", "zrevrange", "srem", "zrem",
     "sscan"),
    key_spaces=key_spaces,
)  # fmt: skip
