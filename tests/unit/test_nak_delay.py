"""How long `DeadLetters.settle` makes a failed delivery wait: the back-off, except the last wait
of an event waiting for an earlier one (`ckpt_ha.bus.delivery.nak_delay`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.dead_letter_policy import DeadLetters
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.restore_coordinator.app import grace, load_failed_grace
from ckpt_ha.restore_coordinator.settings import RestoreCoordinatorSettings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CFG = BusConfig(ack_wait_s=5.0, max_deliver=4, backoff_s=(0.5, 1.0, 2.0))
"""The fault stack's budget: 0.5 + 1 + 2 s of back-off, shorter than ``ack_wait``."""


@dataclass
class Delivery:
    """What `DeadLetters.settle` reads of a JetStream message, and the nak it sends."""

    delivered: int
    subject: str = "ckpt.ev.checkpoint.verified.v1.job-1"
    delays: list[float | None] = field(default_factory=list)

    @property
    def metadata(self) -> SimpleNamespace:
        return SimpleNamespace(
            num_delivered=self.delivered, timestamp=T0, sequence=SimpleNamespace(stream=7)
        )

    async def nak(self, delay: float | None = None) -> None:
        self.delays.append(delay)


def letters(age_s: float) -> DeadLetters:
    return DeadLetters(CFG, "registrar", clock=lambda: T0 + timedelta(seconds=age_s))


@pytest.mark.parametrize(
    ("error", "delivered", "want"),
    [
        # The last nak (delivery 3 of 4) of an event waiting for an earlier one: until it is
        # as old as a redelivery can take (4 x 5 s held + 3.5 s of back-off), 1 s old now.
        (DependencyNotReady("checkpoint.verified for c", "its committed event"), 3, 22.5),
        # Earlier naks keep the back-off: a replica a moment behind is not waited for long.
        (DependencyNotReady("checkpoint.verified for c", "its committed event"), 1, 0.5),
        # The nak before the last waits so too (a delivery lost in a pull skips a number).
        (DependencyNotReady("checkpoint.verified for c", "its committed event"), 2, 22.5),
        # A wait with its own deadline (the coordinator's verification grace): the back-off.
        (DependencyNotReady("job.failed of j", "a verification", in_stream=False), 3, 2.0),
        # Any other failure: the back-off.
        (RuntimeError("redis down"), 3, 2.0),
    ],
)
async def test_the_nak_waits(error: BaseException, delivered: int, want: float) -> None:
    raw = Delivery(delivered)
    await letters(age_s=1.0).settle(raw, error, "registrar--checkpoints")  # type: ignore[arg-type]
    assert raw.delays == [pytest.approx(want)]


async def test_an_event_already_that_old_waits_its_back_off() -> None:
    raw = Delivery(3)
    error = DependencyNotReady("checkpoint.verified for c", "its committed event")
    await letters(age_s=60.0).settle(raw, error, "registrar--checkpoints")  # type: ignore[arg-type]
    assert raw.delays == [2.0]


def test_the_retry_budget_is_the_back_off_before_the_last_delivery() -> None:
    assert CFG.retry_budget_s == 0.5 + 1.0 + 2.0
    assert CFG.redelivery_bound_s == 4 * 5.0 + CFG.retry_budget_s


@pytest.mark.parametrize(("grace_s", "want"), [(40.0, 3.5), (2.0, 2.0)])
def test_the_verification_grace_is_cut_to_the_retry_budget(grace_s: float, want: float) -> None:
    """A failure nak'ed for longer than the budget would be dead-lettered, never planned."""
    settings = RestoreCoordinatorSettings(
        max_deliver=4, backoff_s=(0.5, 1.0, 2.0), verification_grace_s=grace_s
    )
    assert grace(settings) == want


@pytest.mark.parametrize(("grace_s", "want"), [(40.0, 3.5), (2.0, 2.0)])
def test_the_load_failure_grace_is_cut_to_the_retry_budget(grace_s: float, want: float) -> None:
    """A resumed attempt's failure waits for its load failure nak'ed like a failure awaiting a
    verification: never past the last delivery (it would be dead-lettered, never planned)."""
    settings = RestoreCoordinatorSettings(
        max_deliver=4, backoff_s=(0.5, 1.0, 2.0), load_failed_grace_s=grace_s
    )
    assert load_failed_grace(settings) == want
