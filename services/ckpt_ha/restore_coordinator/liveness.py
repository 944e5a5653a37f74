"""Lost attempts (R9, issue 16): an attempt that promised heartbeats and went silent.

Pure rules over the one `Watch` the coordinator keeps per job (its latest attempt). Why the
restore-coordinator watches, not a new service: it already consumes every job event in
stream order (starts, progress, failures, successes), already decides what a failure means,
and a lost attempt is just one more failure it then plans like any other. A separate role
would need the same projection of the same events, a second place that can publish
``job.failed``, and a handover between the two for every loss.

How a sign of life moves the deadline:

* ``job.started`` of a newer attempt (same run), or of another run that started later,
  replaces the watch: the older attempt is over either way (its runner moved on, or a new
  run superseded it). An attempt that promised no heartbeat (``heartbeat_s`` None, a v1 start)
  is recorded unwatched: it is never lost. Its deadline is `ckpt_ha.core.tiers.lost_after`.
* ``job.progress`` / ``job.heartbeat`` of the watched attempt move its last sign of life
  forward (never back: the consumers run independently and may deliver late).
* ``job.failed`` / ``job.succeeded`` of the watched attempt, or of a newer one of its run,
  end the watch; the ended watch stays as a tombstone so that a start handled late does not
  arm it again.

The consumers of these events run independently, so live a heartbeat may be handled before its
attempt's start (and is then not counted) where a rebuild, in stream order, counts it: a
running attempt's last sign of life may lag by one report live, never run ahead, and the next
one evens it out. Ended watches are the same either way.

Times are the events' own (the reporter's clock), so a rebuild from the stream arrives at the
same deadlines as the live coordinator did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCauseV2, JobFailedV2, JobStartedV1
from ckpt_ha.core.tiers import lost_after
from ckpt_ha.restore_coordinator.records import Watch, attempt_key

__all__ = ["attempt_key", "event_key", "lost", "lost_event", "on_alive", "on_end", "on_start"]

REPORTER = "restore-coordinator"
SIGNATURE = "lost"


def on_start(watch: Watch | None, started: JobStartedV1, at: datetime) -> Watch | None:
    """The watch after this start (None: unchanged: an older attempt, or a repeat)."""
    if watch is not None:
        if watch.run_id == started.run_id and started.attempt <= watch.attempt:
            return None
        if watch.run_id != started.run_id and at < watch.started_at:
            return None
    return Watch(
        job_id=started.job_id,
        run_id=started.run_id,
        attempt=started.attempt,
        started_at=at,
        seen=at,
        deadline_s=lost_after(started),
        plan_id=started.plan_id,
    )


def on_alive(
    watch: Watch | None, run_id: str, attempt: int, at: datetime, step: int | None = None
) -> Watch | None:
    """The watch after a progress report or a heartbeat (None: not about the watched attempt,
    or not newer than what was heard)."""
    if watch is None or watch.ended or (watch.run_id, watch.attempt) != (run_id, attempt):
        return None
    if at <= watch.seen:
        return None
    return watch.model_copy(
        update={"seen": at, "last_step": step if step is not None else watch.last_step}
    )


def on_end(
    watch: Watch | None, job_id: str, run_id: str, attempt: int, at: datetime
) -> Watch | None:
    """The watch after the attempt failed or succeeded (None: unchanged: an older attempt,
    another run, or already ended): a tombstone of the attempt, whether or not its start was
    handled yet. A tombstone holds the end's time only, so that it is the same whatever the
    consumers' order was live (a progress report handled after the end, a start after it)
    and in a rebuild."""
    if watch is not None:
        if watch.run_id != run_id or attempt < watch.attempt:
            return None
        if watch.ended and attempt == watch.attempt:
            return None
    return Watch(job_id=job_id, run_id=run_id, attempt=attempt, started_at=at, seen=at, ended=True)


def lost(watch: Watch, now: datetime, watching_s: float, heard: datetime | None = None) -> bool:
    """Declare the attempt lost now? Only past its deadline, and only when the coordinator
    itself has been watching (with no backlog) for at least that deadline: right after a
    restart, or after the bus was unreachable, silence may be the watcher's, not the job's.

    The deadline runs on the events' times, the reporter's clock. ``heard``: when (on the
    coordinator's clock) a replica last handled a sign of life of the attempt; within the
    deadline of it, the attempt is alive whatever its clock says (a host whose clock is behind
    by more than the deadline is not lost while it reports)."""
    due = watch.due
    if due is None or watch.deadline_s is None:
        return False
    if heard is not None and (now - heard).total_seconds() <= watch.deadline_s:
        return False
    return now > due and watching_s >= watch.deadline_s


def event_key(watch: Watch) -> str:
    """The lost declaration's event key: one event id per attempt, whichever replica (or
    restart) declares it, so the stream's dedupe keeps one."""
    return f"lost|{watch.job_id}|{watch.run_id}|{watch.attempt}"


def lost_event(watch: Watch, now: datetime) -> JobFailedV2:
    silent = (now - watch.seen).total_seconds()
    return JobFailedV2(
        job_id=watch.job_id,
        run_id=watch.run_id,
        attempt=watch.attempt,
        cause=FailureCauseV2.LOST,
        last_step=watch.last_step,
        detail=(
            f"no progress and no heartbeat for {silent:.0f} s (deadline {watch.deadline_s:g} s, "
            f"last sign of life {watch.seen.isoformat()})"
        ),
        signature=SIGNATURE,
        side=FailureSide.INFRASTRUCTURE,
        plan_id=watch.plan_id,
        reported_by=REPORTER,
    )


Alive = tuple[str, str, int, datetime, int | None]
"""A sign of life: (job, run, attempt, time of the event, step or None)."""


def alive_changes(
    signs: Iterable[Alive],
) -> dict[str, Callable[[Watch | None], Watch | None]]:
    """For each job: the change of its watch that `on_alive` makes for each of its
    signs of life in turn (None: none of them moved it)."""
    by_job: dict[str, list[Alive]] = {}
    for sign in signs:
        by_job.setdefault(sign[0], []).append(sign)
    return {job: _all_alive(mine) for job, mine in by_job.items()}


def _all_alive(signs: Sequence[Alive]) -> Callable[[Watch | None], Watch | None]:
    def change(watch: Watch | None) -> Watch | None:
        moved = None
        for _, run_id, attempt, at, step in signs:
            new = on_alive(moved or watch, run_id, attempt, at, step)
            moved = new or moved
        return moved

    return change


End = tuple[str, str, int, datetime]
"""An attempt's end: (job, run, attempt, time of the event)."""


def ended_changes(ends: Iterable[End]) -> dict[str, Callable[[Watch | None], Watch | None]]:
    """For each job: the change of its watch that `on_end` makes for each of its ends in turn
    (None: none of them moved it)."""
    by_job: dict[str, list[End]] = {}
    for end in ends:
        by_job.setdefault(end[0], []).append(end)

    def all_ended(mine: Sequence[End]) -> Callable[[Watch | None], Watch | None]:
        def change(watch: Watch | None) -> Watch | None:
            moved = None
            for job, run_id, attempt, at in mine:
                moved = on_end(moved or watch, job, run_id, attempt, at) or moved
            return moved

        return change

    return {job: all_ended(mine) for job, mine in by_job.items()}
