"""The token bucket's accounting, on times the test hands it (nothing sleeps, nothing is timed)."""

from __future__ import annotations

import pytest

from ckpt_ha.core.token_bucket import TokenBucket

MIB = 2**20


def test_a_full_bucket_grants_its_burst_at_once_then_makes_takers_wait() -> None:
    bucket = TokenBucket.full(rate=100.0, burst=50.0, now=0.0)
    assert bucket.reserve(30, now=0.0) == 0.0
    assert bucket.reserve(20, now=0.0) == 0.0
    assert bucket.reserve(10, now=0.0) == pytest.approx(0.1)  # 10 tokens at 100/s


def test_tokens_come_back_at_the_rate_up_to_the_burst() -> None:
    bucket = TokenBucket.full(rate=100.0, burst=50.0, now=0.0)
    bucket.reserve(50, now=0.0)
    assert bucket.reserve(20, now=0.2) == 0.0  # 0.2 s brought 20
    bucket.reserve(0, now=100.0)
    assert bucket.tokens == 50.0  # idle for long: never more than the burst


def test_a_request_larger_than_the_burst_waits_for_its_debt_and_the_next_waits_behind_it() -> None:
    bucket = TokenBucket.full(rate=10.0, burst=5.0, now=0.0)
    assert bucket.reserve(25, now=0.0) == pytest.approx(2.0)  # 20 over the burst at 10/s
    assert bucket.reserve(10, now=0.0) == pytest.approx(3.0)  # behind the debt
    assert bucket.reserve(1, now=3.0) == pytest.approx(0.1)


def test_a_refund_gives_back_what_was_not_used_up_to_the_burst() -> None:
    bucket = TokenBucket.full(rate=10.0, burst=5.0, now=0.0)
    bucket.reserve(8, now=0.0)
    bucket.refund(6, now=0.0)  # a short read used 2 of the 8
    assert bucket.tokens == 3.0
    bucket.refund(100, now=0.0)
    assert bucket.tokens == 5.0


def test_a_clock_that_steps_back_refills_nothing() -> None:
    bucket = TokenBucket.full(rate=10.0, burst=5.0, now=100.0)
    bucket.reserve(5, now=100.0)
    assert bucket.reserve(1, now=50.0) == pytest.approx(0.1)
    assert bucket.stamp == 100.0


def test_reading_as_fast_as_allowed_never_exceeds_burst_plus_rate_times_time() -> None:
    """A reader that sleeps exactly what it is told, with mixed read sizes (some above the burst,
    some short reads refunded): at every instant a read starts, what was granted so far is at
    most ``burst + rate * t``, and the whole run takes exactly (total - burst) / rate."""
    rate, burst = 100.0 * MIB, 8.0 * MIB
    bucket = TokenBucket.full(rate, burst, now=0.0)
    now, used = 0.0, 0
    sizes = [MIB, MIB // 3, 20 * MIB, 4096, MIB] * 40
    for i, size in enumerate(sizes):
        now += bucket.reserve(size, now)
        short = i % 7 == 0 and size <= burst  # a short read: the rest is refunded
        got = size // 2 if short else size
        bucket.refund(size - got, now)
        used += got
        assert used <= burst + rate * now + 1e-6 * rate
    # ... and no slower than that: the last read started the moment its bytes were paid for.
    assert now == pytest.approx((used - burst) / rate)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_a_bucket_needs_a_positive_rate_and_burst(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        TokenBucket.full(rate, burst, now=0.0)


def test_negative_amounts_are_refused() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=1.0, now=0.0)
    with pytest.raises(ValueError, match="negative"):
        bucket.reserve(-1, now=0.0)
    with pytest.raises(ValueError, match="negative"):
        bucket.refund(-1, now=0.0)
