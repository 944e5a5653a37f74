"""A batch's projection in Redis: the one read it starts from and the compare-and-set that
writes it (`ckpt_ha.registry.redis_registry.Registry.apply_many` runs both).

The scripts decide nothing about the lifecycle (`ckpt_ha.core.records.project_batch` does, in
Python) and format no key: the caller names every key (`ckpt_ha.registry.keys` builds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import pydantic_core

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.core.records import (
    BatchScope,
    CheckpointRecord,
    FenceKey,
    OwnershipChange,
    TierRecord,
)
from ckpt_ha.registry.client import cas_digest
from ckpt_ha.registry.keys import RegistryKeys

READ_LUA = """
-- One read of everything a batch's projection needs, as one command (a pipeline of one
-- command per location cost the client more than the server). Formats no key: KEYS are
-- the applied ids (a sorted set by event time: a score, or false when not applied), then
-- the owners, records, location sets and fence hashes the batch names (ARGV[1..4] say how
-- many of each); ARGV[5] is how many event ids follow, then the event
-- ids, then one run per fence hash. Loops, not unpack: no limit on the batch's size.
local n_owners, n_records, n_uris, n_fences = tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4])
local n_events = tonumber(ARGV[5])
local seen, owners, records, at_uri, fences = {}, {}, {}, {}, {}
for i = 1, n_events do seen[i] = redis.call('ZSCORE', KEYS[1], ARGV[5 + i]) end
local k = 1
for i = 1, n_owners do owners[i] = redis.call('GET', KEYS[k + i]) end
k = k + n_owners
for i = 1, n_records do records[i] = redis.call('GET', KEYS[k + i]) end
k = k + n_records
for i = 1, n_uris do at_uri[i] = redis.call('SMEMBERS', KEYS[k + i]) end
k = k + n_uris
for i = 1, n_fences do
  fences[i] = redis.call('HGET', KEYS[k + i], ARGV[5 + n_events + i])
end
return {seen, owners, records, at_uri, fences}
"""


def read_call(
    k: RegistryKeys, scope: BatchScope, events: Sequence[Envelope[EventData]]
) -> tuple[list[str], list[str | int]]:
    """`READ_LUA`'s KEYS and ARGV for a batch's scope."""
    keys = [
        k.applied,
        *(k.owner(j) for j in scope.jobs),
        *(k.checkpoint(i) for i in scope.checkpoint_ids),
        *(k.uri(u) for u in scope.uris),
        *(k.fence(job) for job, _ in scope.fences),
    ]
    args: list[str | int] = [
        len(scope.jobs),
        len(scope.checkpoint_ids),
        len(scope.uris),
        len(scope.fences),
        len(events),
        *(e.id for e in events),
        *(r for _, r in scope.fences),
    ]
    return keys, args


WRITE_LUA = """
-- Compare-and-set: write what the Python projection computed, but only if every record and
-- owner is still exactly what that projection read. It decides nothing about the lifecycle,
-- and formats no key: the batch names every key (ckpt_ha.registry.keys builds them).
local batch = cjson.decode(ARGV[1])
for _, r in ipairs(batch.records) do
  local current = redis.call('GET', r.key)
  local digest = current and redis.sha1hex(current) or ''
  if digest ~= r.expect then return 0 end
end
for _, o in ipairs(batch.owners) do
  local owner = redis.call('GET', o.key) or ''
  if owner ~= o.expect then return 0 end
end
for _, f in ipairs(batch.fences) do
  local planned = redis.call('HGET', f.key, f.run) or ''
  if planned ~= f.expect then return 0 end
end
if #batch.events > 0 then
  local scored = {}
  for i, e in ipairs(batch.events) do
    scored[2 * i - 1] = e[2]
    scored[2 * i] = e[1]
  end
  redis.call('ZADD', KEYS[1], unpack(scored))
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. batch.forget_before)
end
for _, r in ipairs(batch.records) do
  redis.call('SET', r.key, r.doc)
  if r.old_state ~= '' then redis.call('SREM', r.old_state, r.id) end
  redis.call('SADD', r.new_state, r.id)
  redis.call('SADD', KEYS[2], r.job)
  redis.call('SADD', r.uri, r.id)
  redis.call('ZADD', r.job_index, r.step, r.id)
end
for _, c in ipairs(batch.changes) do
  if c.from_project ~= '' then redis.call('SREM', c.from_project, c.job) end
  redis.call('SADD', c.to_project, c.job)
  redis.call('SET', c.owner, c.to)
  redis.call('RPUSH', c.owner_log, c.log)
  redis.call('SADD', KEYS[2], c.job)
end
for _, t in ipairs(batch.tiers) do
  redis.call('SET', t.tier, t.doc)
  redis.call('RPUSH', t.tier_log, t.doc)
  redis.call('SADD', KEYS[2], t.job)
end
for _, f in ipairs(batch.fences) do
  if f.attempt ~= '' then redis.call('HSET', f.key, f.run, f.attempt) end
end
return 1
"""


def ms(at: datetime) -> int:
    """A time as the applied set's score: milliseconds since the epoch."""
    return int(at.timestamp() * 1000)


@dataclass(frozen=True)
class RecordWrite:
    old: CheckpointRecord | None
    new: CheckpointRecord
    read: str | None
    """The exact JSON the projection started from (None: no record), for compare-and-set."""


def write_batch(
    k: RegistryKeys,
    forget_before: int,
    fresh: list[tuple[str, int]],
    changed: list[RecordWrite],
    changes: list[OwnershipChange],
    owners_before: dict[str, str | None],
    tiers: list[TierRecord],
    planned_before: dict[FenceKey, int | None],
    fences: dict[FenceKey, int],
) -> bytes:
    """The compare-and-set `WRITE_LUA` runs, as its one argument: expect every record, owner
    and fence read by the projection, write what it changed."""
    # pydantic_core's encoder: a batch is mostly records' JSON documents, escaped once more.
    return pydantic_core.to_json(
        {
            # Scores as strings: cjson would hand Lua a double, whose text may be e-notation.
            "events": [[event_id, str(at)] for event_id, at in fresh],
            "forget_before": str(forget_before),
            "records": [
                {
                    "id": w.new.checkpoint_id,
                    "key": k.checkpoint(w.new.checkpoint_id),
                    "expect": cas_digest(w.read),
                    "doc": w.new.model_dump_json(),
                    "old_state": k.state(w.old.state) if w.old is not None else "",
                    "new_state": k.state(w.new.state),
                    "job": w.new.job_id,
                    "job_index": k.job(w.new.job_id),
                    "uri": k.uri(w.new.uri),
                    "step": w.new.step if w.new.step is not None else -1,
                }
                for w in changed
            ],
            "owners": [
                {"key": k.owner(job), "expect": owners_before.get(job) or ""}
                for job in dict.fromkeys(c.job_id for c in changes)
            ],
            "changes": [
                {
                    "job": c.job_id,
                    "from_project": k.project(c.from_project) if c.from_project else "",
                    "to_project": k.project(c.to_project),
                    "to": c.to_project,
                    "owner": k.owner(c.job_id),
                    "owner_log": k.owner_log(c.job_id),
                    "log": c.model_dump_json(),
                }
                for c in changes
            ],
            "tiers": [
                {
                    "job": t.job_id,
                    "tier": k.tier(t.job_id),
                    "tier_log": k.tier_log(t.job_id),
                    "doc": t.model_dump_json(),
                }
                for t in tiers
            ],
            # Every fence read is compared (a commit was judged against it); the raised
            # ones are written.
            "fences": [
                {
                    "key": k.fence(job),
                    "run": run,
                    "expect": str(before) if before is not None else "",
                    "attempt": str(fences[(job, run)]) if (job, run) in fences else "",
                }
                for (job, run), before in planned_before.items()
            ],
        }
    )
