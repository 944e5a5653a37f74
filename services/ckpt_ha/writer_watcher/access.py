"""What the writer-watcher may do on NATS and Redis (rendered into ``deploy/nats/`` and
``deploy/redis/`` by `ckpt_ha.bus.permissions` and `ckpt_ha.registry.acl`)."""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_ha.bus.access import Principal
from ckpt_ha.registry.access import CONNECT, LEASES, RedisUser
from ckpt_ha.writer_watcher.adapters import state_keys

NATS = Principal("writer-watcher", ("checkpoint.writing", "checkpoint.committed",
                                    "checkpoint.write_failed", "checkpoint.corrupt",
                                    "checkpoint.quarantined", "checkpoint.expired",
                                    "checkpoint.deleted"))  # fmt: skip


def key_spaces(prefix: str) -> Mapping[str, str]:
    """Its own key space: the watch state of every root (`adapters.state_keys`)."""
    return {"watcher-state": state_keys(prefix)}


REDIS = RedisUser(
    "writer-watcher",
    # Watch state per storage root; reads a record to tell a failed write from a lost file,
    # and the writing records (state index) to re-drive them past their deadline.
    # Both quarantine: a move first reads the job's other live records (storage.owned).
    # The lease of its scan (one replica scans a root at a time).
    ("watcher-state", "leases"),
    ("checkpoints", "state-index", "job-index"),
    (*CONNECT, *LEASES, "get", "mget", "smembers", "zrevrange", "hgetall", "hdel",
     "multi", "exec", "discard"),
    key_spaces=key_spaces,
)  # fmt: skip
