"""In-memory retention-janitor view of resumes: the fake of
`ckpt_ha.retention_janitor.store.RedisResumes` (same contract suite,
``tests/support/resume_view_contract.py``), and a `ResumeFeed` a test sets."""

from __future__ import annotations

from collections.abc import Callable

from ckpt_ha.retention_janitor.resumes import JobResumes

KEEP_S = 30 * 24 * 3600.0


class InMemoryResumes:
    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self.by_job: dict[str, JobResumes] = {}

    async def resumes(self, job: str) -> JobResumes:
        return self.by_job.get(job, JobResumes())

    async def update(self, job: str, change: Callable[[JobResumes], JobResumes]) -> JobResumes:
        new = change(self.by_job.get(job, JobResumes()))
        if new.empty():
            self.by_job.pop(job, None)
        else:
            self.by_job[job] = new
        return new


class SettableFeed:
    """Caught up unless a test says the view is behind."""

    def __init__(self) -> None:
        self.behind = False

    async def caught_up(self) -> bool:
        return not self.behind
