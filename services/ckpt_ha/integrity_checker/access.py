"""What the integrity-checker may do on NATS and Redis (rendered into ``deploy/nats/`` and
``deploy/redis/`` by `ckpt_ha.bus.permissions` and `ckpt_ha.registry.acl`)."""

from __future__ import annotations

from ckpt_ha.bus.access import Principal
from ckpt_ha.registry.access import CONNECT, LEASES, RedisUser

NATS = Principal("integrity-checker", ("checkpoint.verified", "checkpoint.corrupt",
                                       "checkpoint.quarantined", "checkpoint.copy_changed"),
                 consumers=("committed", "released", "copies-deleted"))  # fmt: skip

REDIS = RedisUser(
    "integrity-checker",
    # Reads records (verify, scrub); never writes the registry. The leases of its scrub and
    # reconcile loops. The copies read each job's tier (does it replicate, and where).
    ("leases",),
    ("checkpoints", "state-index", "job-index", "tiers", "tier-declared"),
    (*CONNECT, *LEASES, "get", "mget", "smembers", "zrevrange"),
)  # fmt: skip
