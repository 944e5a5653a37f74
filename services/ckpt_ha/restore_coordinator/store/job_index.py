"""The job index's writes (`ckpt_ha.restore_coordinator.api.JobIndexReader` says the layout):
what ``ckpt-ha job list|show`` read instead of the whole event stream.

Fed by the coordinator's index consumers (the event stream's job and resume events, the
progress stream's reports) and by a rebuild's replay, in stream order. An event heard again (a
redelivery, a replayed batch) keeps its first place (``ZADD NX``): the log holds each event
once. A report replaces the stored one only if it is not older, so replicas racing on a job
can at worst keep the older of two reports of the same instant.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from ckpt_ha.contracts import CATALOG, Envelope, EventData
from ckpt_ha.contracts.subjects import TELEMETRY
from ckpt_ha.restore_coordinator.api import INDEX, JobIndexReader, key
from ckpt_ha.restore_coordinator.store.base import script


def indexed(event: Envelope[EventData]) -> bool:
    """Whether the job index keeps the event: a job's or a restore's (a checkpoint's is in the
    registry)."""
    return not event.data.EVENT_TYPE.startswith("checkpoint.")


def _step(event: Envelope[EventData]) -> int | None:
    data = event.data
    step = getattr(data, "step", None) if data.EVENT_TYPE == "job.progress" else None
    return step if step is not None else getattr(data, "last_step", None)


class RedisJobIndex(JobIndexReader):
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self._seq = key(prefix, INDEX, "seq")
        self._record_script = client.register_script(script("job_index"))

    async def record(self, events: Sequence[Envelope[EventData]]) -> None:
        """Index these events (stream order; checkpoint events are skipped)."""
        logged = [e for e in events if indexed(e) and e.data.EVENT_TYPE not in TELEMETRY]
        reports = [e for e in events if e.data.EVENT_TYPE in TELEMETRY]
        if logged:
            top = int(await self._r.incrby(self._seq, len(logged)))
            # One script call (`lua/job_index.lua`): a ZADD NX per job's log and per job,
            # each member at its first place in the batch (as one ZADD NX per event would
            # leave it).
            logs: dict[str, dict[bytes, int]] = {}
            jobs: dict[str, int] = {}
            for n, event in enumerate(logged, start=top - len(logged) + 1):
                job = event.data.job_id
                logs.setdefault(job, {}).setdefault(event.to_bytes(), n)
                jobs.setdefault(job, n)
            keys = [self._k("all")]
            args: list[str | bytes | int] = []
            for job, members in logs.items():
                keys.append(self._k("log", job))
                args += (job, jobs[job], len(members))
                for member, place in members.items():
                    args += (place, member)
            await self._record_script(keys=keys, args=args)
        if reports:
            await self._reports(reports)

    async def _reports(self, reports: Sequence[Envelope[EventData]]) -> None:
        newest: dict[tuple[str, str], Envelope[EventData]] = {}
        for e in reports:  # the batch's newest of each kind per job
            for kind in ("last", "step") if _step(e) is not None else ("last",):
                seen = newest.get((e.data.job_id, kind))
                if seen is None or e.time >= seen.time:
                    newest[(e.data.job_id, kind)] = e
        slots = list(newest)
        async with self._r.pipeline(transaction=False) as pipe:
            for job, kind in slots:
                pipe.hget(self._k("reports", job), kind)
            olds = await pipe.execute()
        writes = [
            (slot, newest[slot])
            for slot, old in zip(slots, olds, strict=True)
            if old is None or CATALOG.decode(_raw(old)).time <= newest[slot].time
        ]
        if not writes:
            return
        top = int(await self._r.incrby(self._seq, len(writes)))
        async with self._r.pipeline(transaction=False) as pipe:
            for n, ((job, kind), e) in enumerate(writes, start=top - len(writes) + 1):
                pipe.hset(self._k("reports", job), kind, e.to_bytes())
                pipe.zadd(self._k("all"), {job: n}, nx=True)
            await pipe.execute()


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value
