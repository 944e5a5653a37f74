"""What the registrar may do on NATS and Redis (rendered into ``deploy/nats/`` and
``deploy/redis/`` by `ckpt_ha.bus.permissions` and `ckpt_ha.registry.acl`)."""

from __future__ import annotations

from ckpt_ha.bus.access import Principal
from ckpt_ha.registry.access import CONNECT, PROJECTION, RedisUser

# "fences": the plans (``resume.planned``) that fence a run's older attempts.
NATS = Principal("registrar", ("checkpoint.registered", "checkpoint.conflict",
                               "checkpoint.fenced"),
                 consumers=("checkpoints", "fences"))  # fmt: skip

REDIS = RedisUser(
    "registrar",
    # Projects every checkpoint event and the fences of the plans: the compare-and-set script
    # and the reads before it. And which event stream the registry is built from (`stream`),
    # once, at start. The registry's compare-and-set is a Lua script (EVALSHA, SCRIPT LOAD when
    # the server lost it): Redis checks every ``redis.call`` inside it against the caller's ACL
    # too, so the registrar is granted the commands the script runs.
    ("checkpoints", "job-index", "state-index", "uri-index", "jobs", "applied", "owners",
     "projects", "owner-log", "tiers", "tier-log", "fences", "stream"),
    ("tier-declared",),
    (*CONNECT, "mget", "smembers", "evalsha", "script|load", *PROJECTION),
)  # fmt: skip
