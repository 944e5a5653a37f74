"""Every key under a registry prefix, with its value and its expiry: what a registry flushed and
rebuilt from the event stream must hold again, key for key."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from ckpt_ha.registry.keys import TRANSIENT as LEASES

TRANSIENT = tuple(f":{space}" for space in LEASES)
"""Registry keys a rebuild does not bring back (`ckpt_ha.registry.keys.TRANSIENT`): which
replica runs a periodic loop, who decides a failure right now."""


JOB_INDEX = ":coord:jobs:"
"""The restore-coordinator's job index: each job's events in the order they were handled, by
an ordinal a rebuild gives anew (other numbers, the same order). Compared by order; its
ordinal counter (`JOB_INDEX_SEQ`) is left out unless asked for."""

JOB_INDEX_SEQ = f"{JOB_INDEX}seq"
"""The job index's ordinal counter: a rebuild counts anew, so a snapshot to compare leaves it
out; one of every key (``ordinals=True``) holds it."""


@dataclass(frozen=True)
class Key:
    kind: str
    value: Any
    expires_at: float | None
    """Unix time the key expires (None: it never does)."""


async def snapshot(
    r: aioredis.Redis, prefix: str, *, transient: Iterable[str] = (), ordinals: bool = False
) -> dict[str, Key]:
    """Every key under ``<prefix>:`` but those containing one of ``transient``, and but the job
    index's ordinal counter unless ``ordinals`` (what a flush removes: every key). Values in a
    comparable form (sets and hashes sorted; sorted sets with scores in order)."""
    skip = tuple(transient)
    out: dict[str, Key] = {}
    async for raw in r.scan_iter(match=f"{prefix}:*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        if any(t in key for t in skip) or (not ordinals and key.endswith(JOB_INDEX_SEQ)):
            continue
        kind = await r.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        value: Any
        if kind == "string":
            value = await r.get(key)
        elif kind == "hash":
            value = sorted((await r.hgetall(key)).items())
        elif kind == "set":
            value = sorted(await r.smembers(key))
        elif kind == "zset" and JOB_INDEX in key:
            value = await r.zrange(key, 0, -1)  # in order: its ordinals are not rebuilt alike
        elif kind == "zset":
            value = await r.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = await r.lrange(key, 0, -1)
        else:
            raise AssertionError(f"{key}: unexpected Redis type {kind}")
        pttl = await r.pttl(key)
        if pttl == -2:
            continue  # expired while being read
        out[key] = Key(kind, value, time.time() + pttl / 1000 if pttl >= 0 else None)
    return dict(sorted(out.items()))


async def flush(r: aioredis.Redis, prefix: str) -> int:
    """Delete every key under ``<prefix>:`` (what a FLUSHALL does to one registry, without
    touching anyone else's keys in a shared Redis). Returns how many."""
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
    for i in range(0, len(keys), 500):
        await r.delete(*keys[i : i + 500])
    return len(keys)


def differences(
    before: dict[str, Key], after: dict[str, Key], *, expiry_slack_s: float
) -> list[str]:
    """What differs, one line per key: missing, extra, another value, or an expiry that is
    present in one and not the other, or further apart than ``expiry_slack_s``."""
    out = [f"missing {k}: {before[k]}" for k in sorted(set(before) - set(after))]
    out += [f"extra {k}: {after[k]}" for k in sorted(set(after) - set(before))]
    for k in sorted(set(before) & set(after)):
        b, a = before[k], after[k]
        if (b.kind, b.value) != (a.kind, a.value):
            out.append(f"value of {k}:\n  before {b.value!r}\n  after  {a.value!r}")
        elif (b.expires_at is None) != (a.expires_at is None):
            out.append(f"expiry of {k}: before {b.expires_at}, after {a.expires_at}")
        elif (
            b.expires_at is not None
            and a.expires_at is not None
            and (abs(b.expires_at - a.expires_at) > expiry_slack_s)
        ):
            out.append(f"expiry of {k}: before {b.expires_at:.0f}, after {a.expires_at:.0f}")
    return out
