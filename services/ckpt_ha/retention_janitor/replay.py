"""The retention-janitor's view of resumes, replayed by a registry rebuild through the janitor's
own projection (the rebuild reads the stream once and hands each event to every view)."""

from __future__ import annotations

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.retention_janitor import projection
from ckpt_ha.retention_janitor.ports import ResumeView


class ResumeViewReplay:
    """The retention-janitor's view of resumes, replayed through its own projection."""

    def __init__(self, view: ResumeView) -> None:
        self.view = view

    async def apply(self, event: Envelope[EventData]) -> None:
        if isinstance(event.data, projection.PROJECTED):
            keep_s = self.view.keep_s
            await self.view.update(event.data.job_id, lambda v: projection.apply(v, event, keep_s))
