"""The hang threshold's model (issue 28), on a fake clock: the runner polls every rank's mark
once a second; long saves and evaluations never trip it, a stall does within the bound
max(10 x the median step interval, 60 s)."""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.runner import hangwatch
from ckpt_ha.runner.hang import Hang, HangDetector, HangPolicy, as_failure, quantile
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.marks import Mark
from ckpt_ha.sdk.protocol import Context

POLL_S = 1.0


class Job:
    """A fake job on a fake clock: ranks stepping in lockstep, with slow phases and stalls."""

    def __init__(self, ranks: int = 2, policy: HangPolicy | None = None) -> None:
        self.now = 0.0
        self.next_poll = POLL_S
        self.detector = HangDetector(policy or HangPolicy())
        self.marks = {r: Mark(step=None, at=0.0) for r in range(ranks)}
        self.step = 0
        self.verdicts: list[tuple[float, Hang]] = []

    def poll_until(self, until: float) -> None:
        """The clock moves to ``until``; the runner polls at every whole second on the way."""
        while self.next_poll <= until:
            self.now = self.next_poll
            self.next_poll += POLL_S
            for rank, mark in self.marks.items():
                self.detector.observe(rank, mark, self.now)
            hang = self.detector.verdict(self.now)
            if hang is not None:
                self.verdicts.append((self.now, hang))
        self.now = until

    def steps(
        self, count: int, interval: Callable[[], float], ranks: list[int] | None = None
    ) -> None:
        for _ in range(count):
            self.poll_until(self.now + interval())
            self.step += 1
            for r in ranks if ranks is not None else list(self.marks):
                self.marks[r] = Mark(step=self.step, at=self.now)

    def phase(self, name: str | None, ranks: list[int] | None = None) -> None:
        for r in ranks if ranks is not None else list(self.marks):
            self.marks[r] = Mark(self.marks[r].step, self.marks[r].at, name)


def every(seconds: float) -> Callable[[], float]:
    return lambda: seconds


def test_a_stall_is_declared_within_the_bound_naming_the_step_and_the_rank() -> None:
    job = Job()
    job.steps(20, every(2.0))
    # rank 1 stops before reporting step 21; rank 0 reports it, then waits for rank 1.
    job.steps(1, every(2.0), ranks=[0])
    stalled_at = job.now
    job.poll_until(job.now + 300)
    assert job.verdicts, "a stall of 300 s was never declared"
    when, hang = job.verdicts[0]
    bound = max(10 * 2.0, 60.0)
    assert when - stalled_at <= bound
    assert hang.stalled_ranks == (1,)
    assert hang.last_step == 20
    assert hang.threshold_s == 30.0  # max(floor, 5 x p95 of 2 s)
    text = hang.detail()
    assert "last step 20" in text
    assert "rank(s) 1 stopped first" in text


def test_a_slow_job_gets_a_threshold_from_its_own_steps() -> None:
    job = Job()
    job.steps(20, every(40.0))  # 40 s per step: 5 x 40 = 200 s
    assert job.detector.threshold() == 200.0
    job.poll_until(job.now + 190)  # longer than any floor, shorter than its own threshold
    assert not job.verdicts
    job.poll_until(job.now + 100)
    assert job.verdicts
    assert job.verdicts[0][0] - (job.now - 290) <= max(10 * 40.0, 60.0)


def test_a_job_reporting_every_fifty_steps_is_judged_on_its_reports() -> None:
    """A Trainer logs (and so reports progress) every ``logging_steps``: 50 steps of 0.5 s are
    25 s of silence between two reports, every time, and never a hang."""
    job = Job()
    for _ in range(20):
        job.poll_until(job.now + 25.0)
        job.step += 50
        for r in job.marks:
            job.marks[r] = Mark(step=job.step, at=job.now)
    assert not job.verdicts
    assert job.detector.threshold() == 125.0  # 5 x 25 s


def test_a_long_save_never_trips_it_and_silence_counts_again_after() -> None:
    job = Job()
    job.steps(10, every(1.0))
    job.phase("save")
    job.poll_until(job.now + 1800)  # a 30-minute save
    assert not job.verdicts
    job.phase(None)
    ended = job.now
    job.poll_until(job.now + 29)
    assert not job.verdicts  # silence counts from the end of the save, not the last step
    job.poll_until(job.now + 10)
    assert job.verdicts
    assert job.verdicts[0][0] - ended <= 30 + 2 * POLL_S  # seen at the next poll


def test_one_rank_evaluating_holds_the_others_waiting_for_it() -> None:
    job = Job(ranks=4)
    job.steps(10, every(0.5))
    job.phase("eval", ranks=[0])  # ranks 1-3 wait in a collective, silent and unmarked
    job.poll_until(job.now + 900)
    assert not job.verdicts


def test_a_rank_stuck_behind_a_collective_save_is_not_excused_by_it() -> None:
    """Rank 1 stops before step 50; rank 0 reports 50 and enters the (collective) save of step
    50, where it waits for rank 1: the save's phase must not hide rank 1's stall."""
    job = Job()
    job.steps(49, every(0.3))
    job.steps(1, every(0.3), ranks=[0])
    job.phase("save", ranks=[0])
    stalled_at = job.now
    job.poll_until(job.now + 120)
    assert job.verdicts
    when, hang = job.verdicts[0]
    assert when - stalled_at <= 60
    assert hang.stalled_ranks == (1,)
    assert hang.last_step == 49
    assert hang.phase is None


def test_the_first_steps_after_a_start_or_a_restore_do_not_count() -> None:
    job = Job()
    job.poll_until(600)  # loading, compiling: no step yet
    job.steps(2, every(300.0))  # two very slow first steps (the warm-up)
    assert not job.verdicts
    assert job.detector.threshold() == 1800.0  # too few intervals: the collectives' timeout
    job.steps(3, every(1.0))
    assert job.detector.threshold() == 30.0  # the warm-up is not in the statistics


def test_a_stall_in_the_first_steps_is_a_hang_only_after_the_unknown_threshold() -> None:
    job = Job()
    job.steps(3, every(1.0))
    stalled_at = job.now
    job.poll_until(job.now + 1799)
    assert not job.verdicts
    job.poll_until(job.now + 3)
    assert job.verdicts[0][0] - stalled_at <= 1800 + 2 * POLL_S  # seen at the next poll
    assert job.verdicts[0][1].threshold_s == 1800.0


def test_a_slow_phase_past_its_ceiling_is_a_hang_too() -> None:
    job = Job(policy=HangPolicy(slow_phase_ceiling_s=120))
    job.steps(10, every(1.0))
    job.phase("save", ranks=[1])
    job.poll_until(job.now + 121)
    assert not job.verdicts
    job.poll_until(job.now + 2)
    hang = job.verdicts[0][1]
    assert hang.phase == "save"
    assert hang.stalled_ranks == (1,)
    assert "in its save phase" in hang.detail()


def test_the_per_job_override_replaces_the_adaptive_threshold() -> None:
    job = Job(policy=HangPolicy(fixed_s=600))
    job.steps(10, every(1.0))
    job.poll_until(job.now + 590)
    assert not job.verdicts
    job.poll_until(job.now + 20)
    assert job.verdicts[0][1].threshold_s == 600


def test_ranks_in_lockstep_name_the_one_whose_last_report_is_oldest() -> None:
    job = Job(ranks=3)
    job.steps(10, every(1.0))
    job.steps(1, every(5.0), ranks=[0, 2])  # same step count for rank 1 would tie: it is behind
    job.poll_until(job.now + 60)
    assert job.verdicts[0][1].stalled_ranks == (1,)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_thirty_minutes_of_noisy_steps_slow_evals_and_slow_saves_trip_nothing(seed: int) -> None:
    rng = random.Random(seed)
    job = Job(ranks=2)
    job.steps(5, lambda: rng.uniform(5, 30))  # warm-up
    intervals: list[float] = []

    def noisy() -> float:
        value = rng.lognormvariate(0, 0.5)  # ~1 s median, a heavy tail
        intervals.append(value)
        return value

    while job.now < 1800:
        job.steps(50, noisy)
        job.phase("eval", ranks=[0])
        job.poll_until(job.now + rng.uniform(60, 300))
        job.phase(None)
        job.steps(10, noisy)
        job.phase("save")
        job.poll_until(job.now + rng.uniform(30, 600))
        job.phase(None)
    assert not job.verdicts
    # ... and the same job stalling is caught within the bound.
    stalled_at = job.now
    job.poll_until(job.now + 120)
    assert job.verdicts
    assert job.verdicts[0][0] - stalled_at <= max(10 * statistics.median(intervals), 60.0)


def test_quantile_is_nearest_rank() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0] * 19 + [100.0], 0.95) == 1.0
    assert quantile([1.0] * 19 + [100.0], 0.96) == 100.0


def test_a_hang_is_reported_as_its_own_cause_with_a_signature_without_the_step() -> None:
    one = as_failure(Hang(10, (1,), 45.0, 30.0), None, 9)
    two = as_failure(Hang(99, (1,), 31.0, 30.0), None, 9)
    assert one.cause is FailureCause.HANG
    assert one.stalled_ranks == (1,)
    assert one.hang_after_s == 30.0
    assert one.signature == two.signature  # the same hang after a restore repeats (R9)


# --- the marks the SDK writes -------------------------------------------------------------


def ctx_for(tmp_path: Path, rank: int = 0) -> Context:
    return Context(
        job_id="j", run_id="r", attempt=1, storage_root=None, bus=None,
        progress_file=str(tmp_path / "progress"), rank=rank, world_size=2,
    )  # fmt: skip


def test_marks_name_the_step_and_the_slow_phase_and_nest(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, rank=1)
    path = marks.mark_path(str(tmp_path / "progress"), 1)
    marks.stepped(ctx, 7)
    first = marks.read(path)
    assert first is not None
    assert first.step == 7
    assert first.phase is None
    with marks.slow_phase("eval", ctx):
        assert (marks.read(path) or first).phase == "eval"
        with marks.slow_phase("my own thing", ctx):
            assert (marks.read(path) or first).phase == "other"
        assert (marks.read(path) or first).phase == "eval"
    after = marks.read(path)
    assert after is not None
    assert after.phase is None
    assert after.step == 7


def test_a_mark_that_is_not_one_reads_as_none(tmp_path: Path) -> None:
    for text in ("", "[]", '{"step": -1, "at": 1}', '{"step": true, "at": 1}', '{"step": 1}'):
        assert marks.parse(text) is None, text
    assert marks.read(str(tmp_path / "missing")) is None
    assert marks.parse('{"step": 3, "at": 1.5, "phase": "weird"}') == Mark(3, 1.5, "other")


# --- the runner's watch over one attempt (files and a fake adapter: no process) ---------------


class FakeAdapter:
    """Stops slowly: the attempt's end (its wait returning) comes while `stop` still runs."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.stop_done = threading.Event()

    def stop(self, grace_s: float) -> None:
        self.stopped.set()
        time.sleep(0.2)
        self.stop_done.set()


async def test_the_watch_reports_the_hang_it_declared_after_the_stop_finished(
    tmp_path: Path,
) -> None:
    progress = tmp_path / "progress"
    ctx = ctx_for(tmp_path, rank=1)
    clock = {"now": 0.0}
    adapter = FakeAdapter()
    holder = hangwatch.HangWatch()
    task = asyncio.create_task(
        hangwatch.watch(progress, HangPolicy(fixed_s=5), adapter, lambda _: None, holder,  # type: ignore[arg-type]
                        every_s=0.01, clock=lambda: clock["now"])
    )  # fmt: skip
    holder.task = task
    marks.stepped(ctx, 3)
    await asyncio.sleep(0.1)
    clock["now"] = 10.0  # silent for 10 s on the runner's clock
    await asyncio.to_thread(adapter.stopped.wait, 5)
    # The attempt ends as soon as it is signalled, before `stop` returns: the verdict stands.
    hang = await hangwatch.outcome(holder)
    assert hang is not None
    assert hang.stalled_ranks == (1,)
    assert adapter.stop_done.is_set()  # reported only once every process is gone


async def test_an_attempt_that_ends_by_itself_has_no_hang(tmp_path: Path) -> None:
    holder = hangwatch.start(tmp_path / "progress", HangPolicy(), FakeAdapter(), lambda _: None)  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert await hangwatch.outcome(holder) is None
    assert holder.task is not None
    assert holder.task.cancelled()
    assert await hangwatch.outcome(None) is None


def test_marks_of_an_earlier_attempt_are_cleared(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    marks.stepped(ctx_for(tmp_path, rank=0), 1)
    marks.stepped(ctx_for(tmp_path, rank=1), 1)
    assert sorted(hangwatch.rank_files(progress)) == [0, 1]
    hangwatch.clear(progress)
    assert hangwatch.rank_files(progress) == {}
