"""A token bucket: a rate with a burst, as pure arithmetic on the times it is given.

No clock and no sleeping here: the caller passes ``now`` and waits the seconds `reserve`
returns, so the accounting is deterministic in tests (`ckpt_ha.storage.read_budget` is the
caller that reads bytes through it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up.

    Invariant: starting full at ``t0``, the tokens granted for use by any time ``t`` are at most
    ``burst + rate * (t - t0)``. A request larger than what the bucket holds is granted with a
    debt: its taker waits until the debt is paid, and later takers wait behind it. That lets a
    single request exceed ``burst`` (a read larger than the burst) without breaking the bound.
    """

    rate: float
    burst: float
    tokens: float
    """The current level; negative while in debt."""
    stamp: float
    """When `tokens` was last brought up to date."""

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError(f"need rate > 0 and burst > 0, got {self.rate} and {self.burst}")

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=burst, stamp=now)

    def reserve(self, n: int, now: float) -> float:
        """Take ``n`` tokens at ``now``; the seconds the caller must wait before using them
        (0.0 when the bucket held them)."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative amount: {n}")
        self._refill(now)
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def refund(self, n: int, now: float) -> None:
        """Give back ``n`` tokens reserved but not used (a read that returned fewer bytes)."""
        if n < 0:
            raise ValueError(f"cannot refund a negative amount: {n}")
        self._refill(now)
        self.tokens = min(self.burst, self.tokens + n)

    def _refill(self, now: float) -> None:
        if now > self.stamp:  # a clock that steps back refills nothing
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
