"""Tombstones leaving the registry's hot index (R6): the one script that removes a deleted
checkpoint's record and its index entries, once the retention-janitor has archived it
(`ckpt_ha.retention_janitor.archive`).

A compare-and-set per tombstone: removed only if the record is still exactly the document that
was archived (a late event that changed it since, e.g. a replica's copy recorded deleted, keeps
it until the next round archives the new document), and only a deleted one. Keys are formatted
by `ckpt_ha.registry.keys` only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.registry.client import cas_digest
from ckpt_ha.registry.keys import RegistryKeys

FORGET_LUA = """
-- KEYS: four per tombstone (its record, the deleted-state set, its job's index, its location's
-- set); ARGV: two per tombstone (its id, the digest of the record as archived).
local removed = {}
for i = 1, #ARGV / 2 do
  local id, expect = ARGV[2 * i - 1], ARGV[2 * i]
  local current = redis.call('GET', KEYS[4 * i - 3])
  if current and redis.sha1hex(current) == expect then
    redis.call('DEL', KEYS[4 * i - 3])
    redis.call('SREM', KEYS[4 * i - 2], id)
    redis.call('ZREM', KEYS[4 * i - 1], id)
    redis.call('SREM', KEYS[4 * i], id)
    removed[#removed + 1] = id
  end
end
return removed
"""


def forget_call(
    keys: RegistryKeys, records: Sequence[CheckpointRecord]
) -> tuple[list[str], list[str]]:
    """The script's KEYS and ARGV for these tombstones (deleted records only; others are left
    out: only a tombstone leaves the index)."""
    script_keys: list[str] = []
    args: list[str] = []
    for r in records:
        if r.state is not CheckpointState.DELETED:
            continue
        script_keys += [
            keys.checkpoint(r.checkpoint_id),
            keys.state(CheckpointState.DELETED),
            keys.job(r.job_id),
            keys.uri(r.uri),
        ]
        args += [r.checkpoint_id, cas_digest(r.model_dump_json())]
    return script_keys, args
