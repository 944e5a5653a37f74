"""Checkpoint interval advice (R3): the advisor's numbers against values worked out by hand.

Inputs are chosen so the square roots come out round: S = 50 s, M = 10 000 s gives
sqrt(2·50·10 000) = 1000 s and S/(2M) = 0.0025, sqrt(0.0025) = 0.05.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from ckpt_ha.core import interval
from ckpt_ha.core.interval import CheckpointTimes

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_young_is_sqrt_2sm() -> None:
    assert interval.young(50, 10_000) == pytest.approx(1000.0)
    assert interval.young(8, 10_000) == pytest.approx(400.0)
    assert interval.young(60, 86_400) == pytest.approx(3219.937887599697)  # sqrt(10 368 000)


def test_daly_higher_order_by_hand() -> None:
    # 1000·(1 + 0.05/3 + 0.0025/9) - 50 = 1000 + 16.6667 + 0.2778 - 50
    assert interval.daly(50, 10_000) == pytest.approx(966.9444444, rel=1e-9)
    # S = 8: sqrt(160 000) = 400, S/(2M) = 0.0004, sqrt = 0.02: 400·(1 + 0.02/3 + 0.0004/9) - 8
    assert interval.daly(8, 10_000) == pytest.approx(400 + 8 / 3 + 0.16 / 9 - 8, rel=1e-12)
    assert interval.daly(8, 10_000) == pytest.approx(394.6844444, rel=1e-9)


def test_daly_is_m_when_the_write_takes_at_least_2m() -> None:
    assert interval.daly(300, 100) == 100  # S = 3M
    assert interval.daly(200, 100) == 100  # S = 2M exactly: the second branch
    # Just below 2M the formula still applies.
    s_, m = 199.0, 100.0
    x = s_ / (2 * m)
    assert interval.daly(s_, m) == pytest.approx(
        math.sqrt(2 * s_ * m) * (1 + math.sqrt(x) / 3 + x / 9) - s_
    )


def test_waste_first_order_model_by_hand() -> None:
    # S/τ + (τ + S)/(2M) + R/M = 50/1000 + 1050/20 000 + 100/10 000 = 0.05 + 0.0525 + 0.01
    assert interval.waste(1000, 50, 10_000, 100) == pytest.approx(0.1125)
    assert interval.waste(1000, 50, 10_000) == pytest.approx(0.1025)


def test_young_minimises_the_first_order_waste() -> None:
    best = interval.young(50, 10_000)
    for other in (best * 0.9, best * 1.1, best / 2, best * 2):
        assert interval.waste(best, 50, 10_000) < interval.waste(other, 50, 10_000)


def test_advice_numbers_by_hand() -> None:
    a = interval.advise(50, 10_000, restart_s=100, current_s=400, checkpoint_bytes=1e9, keep=3)
    daly = 966.9444444444
    assert a.young_s == pytest.approx(1000.0)
    assert a.daly_s == pytest.approx(daly)
    assert a.waste_young == pytest.approx(0.1125)
    assert a.waste_daly == pytest.approx(50 / daly + (daly + 50) / 20_000 + 0.01)
    # current: 50/400 + 450/20 000 + 0.01 = 0.125 + 0.0225 + 0.01
    assert a.waste_current == pytest.approx(0.1575)
    # storage: a checkpoint every τ + S seconds
    assert a.storage_daly.checkpoints_per_day == pytest.approx(86_400 / (daly + 50))
    assert a.storage_daly.bytes_per_day == pytest.approx(86_400 / (daly + 50) * 1e9)
    assert a.storage_daly.steady_state_bytes == pytest.approx(3e9)
    assert a.storage_daly.days_to_steady_state == pytest.approx(3 * (daly + 50) / 86_400)
    assert a.storage_current is not None
    assert a.storage_current.checkpoints_per_day == pytest.approx(86_400 / 450)  # 192
    assert a.storage_current.bytes_per_day == pytest.approx(192e9)
    # 400 / 966.9 = 0.41: outside [0.5x, 2x]
    assert a.verdict == "adjust"
    [warning] = a.warnings
    assert "longer" in warning


@pytest.mark.parametrize(
    ("current", "verdict"),
    [(None, "ok"), (500, "ok"), (1900, "ok"), (480, "adjust"), (2000, "adjust")],
)
def test_warning_outside_half_to_twice_dalys_optimum(current: float | None, verdict: str) -> None:
    a = interval.advise(50, 10_000, current_s=current)  # Daly 966.9: band [483.5, 1933.9]
    assert a.verdict == verdict
    assert len(a.warnings) == (verdict == "adjust")


def test_no_size_or_keep_leaves_storage_unknown() -> None:
    a = interval.advise(50, 10_000)
    assert a.storage_daly.bytes_per_day is None
    assert a.storage_daly.steady_state_bytes is None
    assert a.storage_current is None
    assert a.waste_current is None


def test_write_time_at_least_mtbf_is_unworkable() -> None:
    a = interval.advise(300, 100)
    assert a.verdict == "unworkable"
    assert a.daly_s == 100
    assert a.young_s == pytest.approx(math.sqrt(60_000))
    assert "mean time between failures" in a.warnings[0]
    # Below M but so close that even the optimum loses everything: still unworkable.
    b = interval.advise(90, 100)
    assert b.waste_daly >= 1
    assert b.verdict == "unworkable"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"write_s": 0, "mtbf_s": 100},
        {"write_s": -1, "mtbf_s": 100},
        {"write_s": 10, "mtbf_s": 0},
        {"write_s": 10, "mtbf_s": -5},
        {"write_s": math.nan, "mtbf_s": 100},
        {"write_s": 10, "mtbf_s": math.inf},
        {"write_s": 10, "mtbf_s": 100, "restart_s": -1},
        {"write_s": 10, "mtbf_s": 100, "current_s": 0},
        {"write_s": 10, "mtbf_s": 100, "checkpoint_bytes": -1},
        {"write_s": 10, "mtbf_s": 100, "keep": 0},
    ],
)
def test_bad_inputs_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(interval.BadInput) as err:
        interval.advise(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_write_time_is_the_median_of_start_to_commit() -> None:
    times = [
        CheckpointTimes(started=s(0), committed=s(10)),
        CheckpointTimes(started=s(100), committed=s(130)),
        CheckpointTimes(started=s(200), committed=s(220)),
        CheckpointTimes(started=None, committed=s(300)),  # no start: not a sample
        CheckpointTimes(started=s(400), committed=None),  # never committed: not a sample
    ]
    est = interval.write_time(times)
    assert (est.value, est.samples) == (20.0, 3)
    assert interval.write_time([]).value is None


def test_current_interval_is_spacing_within_a_run_minus_the_write() -> None:
    times = [
        CheckpointTimes(started=s(0), committed=None, run_id="a"),
        CheckpointTimes(started=s(100), committed=None, run_id="a"),
        CheckpointTimes(started=s(200), committed=None, run_id="a"),
        CheckpointTimes(started=s(400), committed=None, run_id="a"),
        # Another run after a failure: the gap from run a to run b is not a spacing.
        CheckpointTimes(started=s(5000), committed=None, run_id="b"),
        CheckpointTimes(started=s(5100), committed=None, run_id="b"),
    ]
    est = interval.current_interval(times, write_s=20)
    assert est.samples == 4  # gaps 100, 100, 200, 100
    assert est.value == 80.0  # median 100 - write 20
    assert interval.current_interval(times[:1], write_s=20).value is None


def test_mtbf_with_failures_and_prior() -> None:
    failures = [T0 + timedelta(hours=1), T0 + timedelta(hours=3)]
    activity = [T0, T0 + timedelta(hours=10)]
    m = interval.mtbf(failures, activity, prior_s=24 * 3600)
    # (10 h + 24 h) / (2 + 1) = 11.333 h
    assert m.value == pytest.approx(34 / 3 * 3600)
    assert (m.failures, m.exposure_s) == (2, 10 * 3600)
    assert m.notes  # two failures: rough


def test_mtbf_without_failures_is_span_plus_prior() -> None:
    m = interval.mtbf([], [T0, T0 + timedelta(hours=10)], prior_s=24 * 3600)
    assert m.value == pytest.approx(34 * 3600)
    assert "no failure observed" in m.notes[0]
    assert interval.mtbf([], [], prior_s=3600).value == 3600


def test_overlapping_writes_are_not_subtracted_from_the_spacing() -> None:
    times = [CheckpointTimes(started=s(k * 10), committed=None, run_id="a") for k in range(3)]
    est = interval.current_interval(times, write_s=15)  # writes longer than the 10 s spacing
    assert est.value == 10.0
    assert "overlap" in est.how
    assert interval.current_interval(times, write_s=None).value == 10.0
