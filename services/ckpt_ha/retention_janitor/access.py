"""What the retention-janitor may do on NATS and Redis (rendered into ``deploy/nats/`` and
``deploy/redis/`` by `ckpt_ha.bus.permissions` and `ckpt_ha.registry.acl`)."""

from __future__ import annotations

from ckpt_ha.bus.access import Principal
from ckpt_ha.registry.access import CONNECT, LEASES, RedisUser

NATS = Principal("retention-janitor", ("checkpoint.expired", "checkpoint.deleted"),
                 consumers=("registered", "started"))  # fmt: skip

REDIS = RedisUser(
    "retention-janitor",
    # Reads jobs, records, tiers, pins and plans in progress; records the declared tier.
    # And the lease of its periodic rounds. SCAN names keys of every space (it takes no key),
    # which is why only the retention-janitor and operators have it.
    ("tier-declared", "leases"),
    ("jobs", "job-index", "checkpoints", "tiers", "pins", "restore-plans",
     "restore-verdicts", "restore-starts"),
    (*CONNECT, *LEASES, "get", "set", "del", "mget", "smembers", "zrevrange",
     "hgetall", "scan"),
)  # fmt: skip
