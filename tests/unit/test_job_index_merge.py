"""A job's events from the job index (its log and its newest reports) fold into the same
summary as the whole of both streams merged by time (`ckpt_ha.ops.jobs.from_index`, issue 33):
only the newest report and the newest naming a step matter, and an event goes before a report
of the same instant, as the stream reader merges them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.job import (
    FailureCause,
    JobFailedV1,
    JobHeartbeatV1,
    JobProgressV1,
    JobStartedV1,
)
from ckpt_ha.ops import jobs

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(s: float, data: EventData) -> Envelope[EventData]:
    return build(data, source="test", time=T0 + timedelta(seconds=s), key=f"{s}")


def merged_by_time(
    events: list[Envelope[EventData]], reports: list[Envelope[EventData]]
) -> list[Envelope[EventData]]:
    """What the stream reader yields: both streams merged by time, an event first on a tie."""
    out, i = [], 0
    for e in events:
        while i < len(reports) and reports[i].time < e.time:
            out.append(reports[i])
            i += 1
        out.append(e)
    return [*out, *reports[i:]]


def test_the_newest_reports_fold_as_all_of_them() -> None:
    job = "j"
    log = [
        at(0, JobStartedV1(job_id=job, run_id="r", attempt=1)),
        at(50, JobFailedV1(job_id=job, run_id="r", attempt=1, cause=FailureCause.NODE_EXIT,
                           signature="s", last_step=None)),
        at(60, JobStartedV1(job_id=job, run_id="r", attempt=2)),
    ]  # fmt: skip
    reports = [
        at(10, JobProgressV1(job_id=job, run_id="r", step=100)),
        at(20, JobHeartbeatV1(job_id=job, run_id="r", last_step=200)),
        at(50, JobProgressV1(job_id=job, run_id="r", step=300)),  # a tie with the failure
        at(70, JobHeartbeatV1(job_id=job, run_id="r")),  # no step: only the time counts
    ]
    whole = jobs.summaries(merged_by_time(log, reports))
    newest = [reports[2], reports[3]]  # the newest naming a step, the newest
    assert jobs.summaries(jobs.from_index(log, newest)) == whole
    [s] = whole
    assert (s.last_step, s.state, s.attempt, s.failures) == (300, "running", 2, 1)
    assert s.last_event_at == T0 + timedelta(seconds=70)
    assert [e.time for e in jobs.from_index(log, newest)] == sorted(e.time for e in [*log, *newest])
