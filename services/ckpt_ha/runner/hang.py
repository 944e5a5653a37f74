"""Hang detection (issue 28): an attempt whose processes live on while its progress stopped.

Pure: the runner feeds `HangDetector` the per-rank marks it reads (`ckpt_ha.sdk.marks`) with
the time it read them on its own clock, and asks for a verdict; no I/O, no clock of its own.

Evidence, and why each piece:

* **Per rank.** Each rank that reports progress is watched alone; its silence runs from the
  last time its mark changed, as the runner saw it (the runner's clock: the rank's own is used
  only for the intervals between two of its own steps, so a skewed host neither hides nor
  invents a hang).
* **An adaptive threshold** (`HangPolicy.threshold`): ``factor`` x the ``percentile`` of the
  job's own recent intervals between progress reports (a job reporting every 50 steps is
  judged on its reports, not its steps) (all ranks, the last ``window`` of them), never under
  ``floor_s``. A job whose steps take 2 s gets max(floor, ~10 s); one whose steps take 5 min
  gets ~25 min. Nothing to configure; ``fixed_s`` overrides it for the rare job that needs it.
* **Slow phases do not count.** While a rank is in a slow phase (a save, an evaluation, a
  load: the SDK, the DCP wrapper and the Trainer callback mark them), its silence does not
  count, nor that of the ranks that may be waiting for it in a collective: those at its step
  or past it. A rank behind that step never reached the phase, and its silence counts (rank 1
  stuck at step 49 while rank 0 waits for it inside the collective save of step 50 is a
  hang). Silence counts again from the end of the phase. A phase longer than
  ``slow_phase_ceiling_s`` (a save on a stalled filesystem) is a hang too.
* **The first steps do not count.** Until ``warmup_intervals`` + ``min_samples`` step
  intervals were seen in this attempt (a start, or a restore: compilation, caches, the load),
  only a silence of ``unknown_s`` (30 min, the collectives' own default timeout) is a hang;
  the intervals of the warm-up are not statistics either. Nothing counts before a rank's
  first mark (the load, the imports).
* **Which ranks stopped first**: those at the lowest last step; among equals, the ones whose
  last change is oldest (within `TIE_S`). In a job in lockstep the others are waiting for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.job import FailureCause
from ckpt_ha.runner.domain import Failure, signature
from ckpt_ha.sdk.marks import Mark

TIE_S = 1.0
"""Ranks whose last change lies within this of the oldest one stopped 'at the same time'."""


@dataclass(frozen=True)
class HangPolicy:
    factor: float = 5.0
    percentile: float = 0.95
    floor_s: float = 30.0
    """No threshold is shorter: a hiccup of the filesystem or the scheduler is not a hang."""
    window: int = 200
    """Recent step intervals the threshold is taken over."""
    warmup_intervals: int = 2
    """Step intervals ignored after a start or a restore (compilation, caches, the load)."""
    min_samples: int = 3
    """Step intervals needed (after the warm-up) before anything can be declared."""
    slow_phase_ceiling_s: float = 3600.0
    """A slow phase longer than this is a hang too (a save on a stalled filesystem)."""
    fixed_s: float | None = None
    """The per-job override: this threshold instead of the adaptive one (no warm-up rule)."""
    unknown_s: float = 1800.0
    """The threshold while the job has shown too few step intervals to judge (its first steps,
    or a short run): only a stall as long as gloo's and NCCL's own default timeout is a hang
    then, however slow a first step may legitimately be (compilation, a cold cache)."""

    def threshold(self, intervals: list[float]) -> float:
        """The silence (s) that is a hang, from the job's recent intervals between reports
        (`unknown_s` while there are fewer than ``min_samples`` of them)."""
        if self.fixed_s is not None:
            return self.fixed_s
        if len(intervals) < self.min_samples:
            return self.unknown_s
        return max(self.floor_s, self.factor * quantile(intervals[-self.window :], self.percentile))


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank, upper) of ``values`` (non-empty)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


@dataclass
class _RankState:
    mark: Mark
    changed: float
    """When the runner saw the mark change (its clock)."""
    seen_steps: int = 0


@dataclass(frozen=True)
class Hang:
    """A verdict: the attempt is hung."""

    last_step: int | None
    """The last step every rank had reached (the lowest of the ranks' last steps)."""
    stalled_ranks: tuple[int, ...]
    """The ranks that stopped first."""
    silent_s: float
    threshold_s: float
    phase: str | None = None
    """Set when the hang is a slow phase past its ceiling (its name)."""

    def detail(self) -> str:
        ranks = ", ".join(str(r) for r in self.stalled_ranks) or "?"
        where = f"in its {self.phase} phase" if self.phase else "outside any save or evaluation"
        step = "no step reported" if self.last_step is None else f"last step {self.last_step}"
        return (
            f"no progress for {self.silent_s:.0f} s {where} while its processes lived "
            f"(threshold {self.threshold_s:g} s); {step}; rank(s) {ranks} stopped first"
        )


@dataclass
class HangDetector:
    """The watch over one attempt (a new one per attempt: its first steps are a warm-up)."""

    policy: HangPolicy
    ranks: dict[int, _RankState] = field(default_factory=dict)
    intervals: list[float] = field(default_factory=list)
    skipped: int = 0
    phase_since: float | None = None
    """Since when (runner's clock) some rank is in a slow phase; None: none is."""
    quiet_from: float = 0.0
    """Silence counts from here at the earliest (the end of the last slow phase)."""

    def observe(self, rank: int, mark: Mark | None, now: float) -> None:
        """What the runner read for ``rank`` at ``now`` (None: no mark, ignored)."""
        if mark is None:
            return
        state = self.ranks.get(rank)
        if state is None:
            self.ranks[rank] = _RankState(mark, now)
        elif mark != state.mark:
            self._interval(state, mark)
            state.mark, state.changed = mark, now
        self._phases(now)

    def _interval(self, state: _RankState, mark: Mark) -> None:
        old = state.mark
        if mark.step is None or old.step is None or mark.step <= old.step:
            return
        if old.phase is not None or mark.phase is not None:
            return  # a slow phase between the two steps: not a step interval
        state.seen_steps += 1
        if self.skipped < self.policy.warmup_intervals:
            self.skipped += 1
            return
        # The time between two reports, not per step: silence is measured between reports, and
        # a job may report every N steps (a Trainer logs every ``logging_steps``). Two reports
        # seen in one poll give a longer gap than either: the safe side.
        gap = mark.at - old.at
        if gap > 0:
            self.intervals.append(gap)
            del self.intervals[: -self.policy.window]

    def _phases(self, now: float) -> None:
        slow = any(s.mark.phase is not None for s in self.ranks.values())
        if slow and self.phase_since is None:
            self.phase_since = now
        elif not slow and self.phase_since is not None:
            self.phase_since = None
            self.quiet_from = now

    def threshold(self) -> float:
        return self.policy.threshold(self.intervals)

    def verdict(self, now: float) -> Hang | None:
        """The attempt is hung now (its processes being alive is the caller's knowledge)."""
        if not self.ranks:
            return None
        if self.phase_since is not None and now - self.phase_since > (
            ceiling := self.policy.slow_phase_ceiling_s
        ):
            phase = next((s.mark.phase for s in self.ranks.values() if s.mark.phase), None)
            slow = tuple(sorted(r for r, s in self.ranks.items() if s.mark.phase is not None))
            return Hang(self._last_step(), slow, now - self.phase_since, ceiling, phase)
        threshold = self.threshold()
        silent = {
            r: now - max(s.changed, self.quiet_from)
            for r, s in self.ranks.items()
            if not self._excused(s)
        }
        if not silent or max(silent.values()) <= threshold:
            return None
        return Hang(self._last_step(), self._first_stopped(), max(silent.values()), threshold)

    def _excused(self, state: _RankState) -> bool:
        """A rank's silence does not count while it, or a rank it may be waiting for, is in a
        slow phase. It may wait only for a rank at its own step or behind it: a rank behind
        the step where another's phase began never reached that phase's collective (rank 0
        saving step 50 excuses rank 1 silent after step 50, not rank 1 stuck at 49)."""
        if state.mark.phase is not None:
            return True
        slow_steps = [s.mark.step for s in self.ranks.values() if s.mark.phase is not None]
        if not slow_steps:
            return False
        mine = state.mark.step
        return mine is None or any(step is None or mine >= step for step in slow_steps)

    def _last_step(self) -> int | None:
        steps = [s.mark.step for s in self.ranks.values() if s.mark.step is not None]
        return min(steps) if steps else None

    def _first_stopped(self) -> tuple[int, ...]:
        def step(r: int) -> int:
            s = self.ranks[r].mark.step
            return -1 if s is None else s

        lowest = min(step(r) for r in self.ranks)
        behind = [r for r in self.ranks if step(r) == lowest]
        oldest = min(self.ranks[r].changed for r in behind)
        return tuple(sorted(r for r in behind if self.ranks[r].changed - oldest <= TIE_S))


def as_failure(hang: Hang, exit_code: int | None, sig: int | None) -> Failure:
    """The failure to report for an attempt stopped as hung (``exit_code`` / ``sig``: how its
    processes ended once stopped). Side unknown: a deadlock in the job and a stalled
    filesystem look the same from outside. The signature holds where it hung (the phase, if
    one) and which ranks stopped first, not the step: the same hang repeating after each
    restore is a restart loop (R9) wherever the step counter stands."""
    ranks = ",".join(str(r) for r in hang.stalled_ranks)
    line = f"hang in {hang.phase or 'training'} ranks {ranks}"
    return Failure(
        cause=FailureCause.HANG,
        side=FailureSide.UNKNOWN,
        detail=hang.detail(),
        signature=signature(FailureCause.HANG, None, None, line),
        exit_code=exit_code,
        signal=sig,
        stalled_ranks=hang.stalled_ranks,
        hang_after_s=hang.threshold_s,
    )
