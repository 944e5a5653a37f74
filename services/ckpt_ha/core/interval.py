"""Checkpoint interval advice (R3): how often a job should checkpoint, and what it costs.

Pure: no I/O. The CLI (`ckpt-ha policy advise`) feeds it either numbers given by hand or numbers
measured from the registry, and prints what it returns. Every number here is an estimate from a
model, not a measurement of the future.

Symbols (all in seconds):

* ``S`` — write time: how long training is held up by one checkpoint write.
* ``M`` — mean time between failures (MTBF) of the job.
* ``R`` — restart time: from a failure until training runs again (detection, relaunch, load).
* ``τ`` — the interval: compute time between the end of one checkpoint write and the start of
  the next. A checkpoint therefore starts every ``τ + S`` seconds (the period).

Optimum intervals:

* Young (1974): ``τ_Y = sqrt(2·S·M)``.
* Daly (2006), higher-order: for ``S < 2M``,
  ``τ_D = sqrt(2·S·M)·[1 + (1/3)·sqrt(S/(2M)) + (1/9)·(S/(2M))] - S``; otherwise ``τ_D = M``.

Expected fraction of time lost (first-order model, the one Young's optimum minimises)::

    waste(τ) = S/τ + (τ + S)/(2M) + R/M

``S/τ`` is the checkpoint overhead; each failure (one every ``M`` seconds on average) costs on
average half a period of recomputation, ``(τ + S)/2``, plus the restart ``R``. It is a first-order
approximation (good while ``τ + S`` is small against ``M``); a value of 1 or more means the job is
not expected to make progress at that interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

DAY_S = 86_400.0
FAR_LOW, FAR_HIGH = 0.5, 2.0
"""A current interval outside [0.5x, 2x] of Daly's optimum is reported as far from it."""
DEFAULT_PRIOR_MTBF_S = 24 * 3600.0
"""With no failure observed yet, the MTBF estimate starts from this prior (one day)."""


class BadInput(ValueError):
    """An input the model cannot use (negative, zero or not a number). One line, exit 2."""

    def __init__(self, name: str, value: float, need: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name} must be {need} (got {value:g})")


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise BadInput(name, value, "a finite number > 0")
    return value


def _non_negative(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise BadInput(name, value, "a finite number >= 0")
    return value


def young(write_s: float, mtbf_s: float) -> float:
    """Young's interval ``sqrt(2·S·M)``."""
    return math.sqrt(2 * _positive("write time", write_s) * _positive("MTBF", mtbf_s))


def daly(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: ``sqrt(2SM)·[1 + (1/3)·sqrt(S/(2M)) + (1/9)·(S/(2M))] - S``
    for ``S < 2M``, else ``M``."""
    s, m = _positive("write time", write_s), _positive("MTBF", mtbf_s)
    if s >= 2 * m:
        return m
    x = s / (2 * m)
    return math.sqrt(2 * s * m) * (1 + math.sqrt(x) / 3 + x / 9) - s


def waste(interval_s: float, write_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected fraction of time lost at interval ``τ``: ``S/τ + (τ + S)/(2M) + R/M``."""
    tau = _positive("interval", interval_s)
    s, m = _positive("write time", write_s), _positive("MTBF", mtbf_s)
    r = _non_negative("restart time", restart_s)
    return s / tau + (tau + s) / (2 * m) + r / m


@dataclass(frozen=True)
class Storage:
    """What checkpointing every ``τ + S`` seconds adds to storage."""

    checkpoints_per_day: float
    bytes_per_day: float | None
    """Checkpoints per day x checkpoint bytes (None: size unknown)."""
    steady_state_bytes: float | None
    """With keep-last N: N x checkpoint bytes, reached after N periods (None: no N or size)."""
    days_to_steady_state: float | None


def storage(
    interval_s: float, write_s: float, checkpoint_bytes: float | None, keep: int | None
) -> Storage:
    period = interval_s + write_s
    per_day = DAY_S / period
    size = checkpoint_bytes if checkpoint_bytes is not None and checkpoint_bytes > 0 else None
    return Storage(
        checkpoints_per_day=per_day,
        bytes_per_day=per_day * size if size is not None else None,
        steady_state_bytes=keep * size if keep is not None and size is not None else None,
        days_to_steady_state=keep * period / DAY_S if keep is not None else None,
    )


@dataclass(frozen=True)
class Advice:
    write_s: float
    mtbf_s: float
    restart_s: float
    young_s: float
    daly_s: float
    waste_young: float
    waste_daly: float
    current_s: float | None
    waste_current: float | None
    storage_daly: Storage
    storage_current: Storage | None
    checkpoint_bytes: float | None
    keep: int | None
    verdict: str
    """``ok``; ``adjust`` (the current interval is far from the optimum); ``unworkable`` (a write
    takes at least as long as the time between failures: no interval helps)."""
    warnings: tuple[str, ...] = ()


def advise(
    write_s: float,
    mtbf_s: float,
    restart_s: float = 0.0,
    current_s: float | None = None,
    checkpoint_bytes: float | None = None,
    keep: int | None = None,
) -> Advice:
    """Young's and Daly's intervals, the waste at the advised (Daly) and current intervals, and
    storage growth. Raises `BadInput` for a negative, zero or non-finite input."""
    s, m = _positive("write time", write_s), _positive("MTBF", mtbf_s)
    r = _non_negative("restart time", restart_s)
    if current_s is not None:
        _positive("current interval", current_s)
    if checkpoint_bytes is not None:
        _non_negative("checkpoint bytes", checkpoint_bytes)
    if keep is not None and keep < 1:
        raise BadInput("keep", keep, "an integer >= 1")
    t_young, t_daly = young(s, m), daly(s, m)
    warnings: list[str] = []
    verdict = "ok"
    if s >= m:
        verdict = "unworkable"
        warnings.append(
            f"a checkpoint write ({s:g} s) takes at least the mean time between failures "
            f"({m:g} s): no interval makes progress likely; make writes faster (async, smaller, "
            "faster storage) or the job more reliable"
        )
    w_daly = waste(t_daly, s, m, r)
    if verdict == "ok" and w_daly >= 1:
        verdict = "unworkable"
        warnings.append(
            f"even at the advised interval about {w_daly:.0%} of the time would be lost: "
            "the job is not expected to make progress"
        )
    w_current = waste(current_s, s, m, r) if current_s is not None else None
    if current_s is not None:
        ratio = current_s / t_daly
        if not FAR_LOW <= ratio <= FAR_HIGH:
            if verdict == "ok":
                verdict = "adjust"
            direction = "shorter" if ratio > FAR_HIGH else "longer"
            warnings.append(
                f"the current interval ({current_s:g} s) is {ratio:.2g}x Daly's optimum "
                f"({t_daly:.0f} s), outside [{FAR_LOW:g}x, {FAR_HIGH:g}x]: checkpoint "
                f"{direction}; expected time lost {w_current:.1%} now vs {w_daly:.1%} advised"
            )
    return Advice(
        write_s=s,
        mtbf_s=m,
        restart_s=r,
        young_s=t_young,
        daly_s=t_daly,
        waste_young=waste(t_young, s, m, r),
        waste_daly=w_daly,
        current_s=current_s,
        waste_current=w_current,
        storage_daly=storage(t_daly, s, checkpoint_bytes, keep),
        storage_current=(
            storage(current_s, s, checkpoint_bytes, keep) if current_s is not None else None
        ),
        checkpoint_bytes=checkpoint_bytes,
        keep=keep,
        verdict=verdict,
        warnings=tuple(warnings),
    )


# --- estimates from what the registry observed ---


@dataclass(frozen=True)
class CheckpointTimes:
    """What one registry record says about its write."""

    started: datetime | None
    """When the write began: the ``writing`` entry, else the identity's ``created_at``."""
    committed: datetime | None
    """When the commit was announced (the ``pending_verification`` entry)."""
    run_id: str | None = None
    total_bytes: int | None = None


@dataclass(frozen=True)
class Estimate:
    value: float | None
    samples: int
    how: str


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def write_time(times: Iterable[CheckpointTimes]) -> Estimate:
    """Median of ``committed - started`` over the checkpoints where both are known."""
    samples = [
        (t.committed - t.started).total_seconds()
        for t in times
        if t.started is not None and t.committed is not None and t.committed > t.started
    ]
    return Estimate(
        _median(samples),
        len(samples),
        f"median of {len(samples)} measured writes (start of write → commit announced)",
    )


def current_interval(times: Iterable[CheckpointTimes], write_s: float | None) -> Estimate:
    """Median spacing of consecutive write starts within one run, minus the write time (so it is
    the same ``τ`` the advice gives). Gaps across runs (a failure, a resubmission) are left out."""
    by_run: dict[str | None, list[datetime]] = {}
    for t in times:
        at = t.started or t.committed
        if at is not None:
            by_run.setdefault(t.run_id, []).append(at)
    gaps = [
        (b - a).total_seconds()
        for starts in by_run.values()
        for a, b in zip(sorted(starts), sorted(starts)[1:], strict=False)
        if b > a
    ]
    spacing = _median(gaps)
    if spacing is None:
        return Estimate(None, 0, "fewer than two checkpoints in one run")
    how = f"median spacing of {len(gaps)} consecutive checkpoint starts ({spacing:.0f} s)"
    if not write_s:
        return Estimate(spacing, len(gaps), how)
    if spacing <= write_s:  # writes back to back, or asynchronous writes outlasting the spacing
        return Estimate(spacing, len(gaps), f"{how}; writes overlap, so not reduced by them")
    return Estimate(spacing - write_s, len(gaps), f"{how} minus the write time ({write_s:.1f} s)")


def checkpoint_size(times: Iterable[CheckpointTimes]) -> Estimate:
    sizes = [float(t.total_bytes) for t in times if t.total_bytes]
    return Estimate(_median(sizes), len(sizes), f"median total_bytes of {len(sizes)} checkpoints")


@dataclass(frozen=True)
class MtbfEstimate(Estimate):
    failures: int = 0
    exposure_s: float = 0.0
    prior_s: float = DEFAULT_PRIOR_MTBF_S
    notes: tuple[str, ...] = field(default=())


def mtbf(
    failures: Sequence[datetime],
    activity: Sequence[datetime],
    prior_s: float = DEFAULT_PRIOR_MTBF_S,
) -> MtbfEstimate:
    """MTBF from ``n`` failures over the observed span ``T`` (first to last time anything was
    seen: a checkpoint write or a failure), with a prior worth one failure per ``prior_s``::

        MTBF ≈ (T + prior) / (n + 1)

    With no failure yet this is ``T + prior`` (a floor that grows as the job runs without
    failing); with many failures it tends to ``T / n``. The span counts restart downtime as
    run time, so it slightly overstates the MTBF of a job that failed often."""
    _positive("prior MTBF", prior_s)
    seen = [*failures, *activity]
    exposure = (max(seen) - min(seen)).total_seconds() if seen else 0.0
    n = len(failures)
    value = (exposure + prior_s) / (n + 1)
    how = (
        f"(observed span {exposure / 3600:.2f} h + prior {prior_s / 3600:g} h) / ({n} failures + 1)"
    )
    notes = []
    if n == 0:
        notes.append(
            f"no failure observed yet: the MTBF is the observed span plus a prior of "
            f"{prior_s / 3600:g} h (pass --mtbf-hours to use a known value)"
        )
    elif n < 3:
        notes.append(f"only {n} failure(s) observed: the MTBF estimate is rough")
    return MtbfEstimate(
        value, n, how, failures=n, exposure_s=exposure, prior_s=prior_s, notes=tuple(notes)
    )
