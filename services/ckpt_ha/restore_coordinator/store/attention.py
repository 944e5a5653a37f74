"""The coordinator's store, its attention side: ``<p>:coord:attention``, one record per job
that needs someone (`Attention`), set and cleared by events (`lua/attention.lua` keeps the
later event's word), read whole by every replica for its metrics."""

from __future__ import annotations

from datetime import datetime

from ckpt_ha.restore_coordinator.records import (
    Attention,
    attention_of,
    attention_value,
    text,
    unix,
)
from ckpt_ha.restore_coordinator.store.base import StoreBase


class AttentionStore(StoreBase):
    """(see `ckpt_ha.restore_coordinator.store`)"""

    async def attend(self, job: str, status: str, reason: str, at: datetime) -> None:
        """The job needs someone since ``at`` (unless a later event already settled it)."""
        await self._attention_script(
            keys=[self._k("attention")],
            args=[job, unix(at), attention_value(status, reason, at), ""],
        )

    async def settle(self, job: str, at: datetime, only: str = "") -> None:
        """An event of time ``at`` ended what the job needed (a record of that time or older;
        with ``only``, a record of that status only)."""
        await self._attention_script(keys=[self._k("attention")], args=[job, unix(at), "", only])

    async def attention(self) -> list[Attention]:
        """Every job's record, by job id (bounded by the jobs that need someone)."""
        raws = await self._r.hgetall(self._k("attention"))
        return sorted(
            (attention_of(text(job), raw) for job, raw in raws.items()), key=lambda a: a.job_id
        )
