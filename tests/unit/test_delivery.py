"""Which messages are parked and which deliveries count against the cap (`ckpt_ha.bus.delivery`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.msg import Msg

from ckpt_ha.bus import delivery
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG, EventCatalog
from ckpt_ha.contracts.errors import MalformedEvent, UnknownEventType, UnsupportedEventVersion
from ckpt_ha.contracts.resume import ResumeLoadFailedV1, ResumeLoadFailedV2
from ckpt_ha.contracts.subjects import EventAddress, event_subject, parse_event_subject

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(event_type: str, version: int) -> EventAddress:
    return EventAddress(event_type, version, "job-1")


def test_a_newer_version_on_its_own_subject_is_parked() -> None:
    error = UnsupportedEventVersion("resume.load_failed", 3, (1, 2))
    assert delivery.newer_than_known(error, at("resume.load_failed", 3))


@pytest.mark.parametrize(
    ("error", "where"),
    [
        # older than the newest known (retired, or a gap): no consumer will ever know it
        (UnsupportedEventVersion("resume.load_failed", 1, (2, 3)), at("resume.load_failed", 1)),
        (UnsupportedEventVersion("resume.load_failed", 2, (1, 3)), at("resume.load_failed", 2)),
        # a body claiming a newer version than the subject it was published on
        (UnsupportedEventVersion("resume.load_failed", 9, (1, 2)), at("resume.load_failed", 1)),
        (UnsupportedEventVersion("resume.load_failed", 9, (1, 2)), at("resume.planned", 9)),
        (UnsupportedEventVersion("resume.load_failed", 9, (1, 2)), None),
        (UnknownEventType("ckpt-ha.checkpoint.exploded.v1"), at("checkpoint.exploded", 1)),
        (MalformedEvent("not JSON"), at("resume.load_failed", 9)),
        (RuntimeError("redis down"), at("resume.load_failed", 9)),
    ],
)
def test_everything_else_is_not_parked(error: BaseException, where: EventAddress | None) -> None:
    assert not delivery.newer_than_known(error, where)


def old_catalog() -> EventCatalog:
    catalog = EventCatalog()
    for model in CATALOG.models().values():
        if model is not ResumeLoadFailedV2:
            catalog.register(model)
    return catalog


def test_parks_here_and_parkable_read_the_subject_against_the_catalogue() -> None:
    subject = event_subject("ckpt", "resume.load_failed", 2, "job-1")
    where = parse_event_subject("ckpt", subject)
    assert delivery.parks_here(old_catalog(), where)
    assert not delivery.parks_here(CATALOG, where)
    assert delivery.parkable(CATALOG, where)  # an old consumer may have parked it
    v1 = at("resume.load_failed", ResumeLoadFailedV1.EVENT_VERSION)
    assert not delivery.parkable(CATALOG, v1)  # a first version is known to every consumer
    assert not delivery.parkable(CATALOG, at("checkpoint.exploded", 2))
    assert not delivery.parkable(CATALOG, None)
    assert not delivery.parks_here(CATALOG, None)


@pytest.mark.parametrize(
    ("delivered", "waited_s", "parkable", "counted"),
    [
        (1, 0, False, 1),
        (5, 10_000, False, 5),  # a first version: every delivery counts, however old
        (12, 3_600, True, 1),  # parked eleven times in an hour (300 s apart): this one counts
        (12, 600, True, 10),  # only two parks fit in ten minutes
        (3, 299, True, 3),  # not one park delay old: nothing excused
        (2, -5, True, 2),  # a clock behind the server's: nothing excused
        (0, 0, True, 1),  # this delivery always counts
    ],
)
def test_attempts_excuse_only_the_parks_time_allows(
    delivered: int, waited_s: float, parkable: bool, counted: int
) -> None:
    now = T0 + timedelta(seconds=waited_s)
    got = delivery.attempts(delivered, T0, now, parkable=parkable, park_delay_s=300)
    assert got == counted


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.events.registrar--checkpoints.3.1042.17.1764620000000000000.5",
        "$JS.ACK._.acchash.events.registrar--checkpoints.3.1042.17.1764620000000000000.5",
        "$JS.ACK.hub.acchash.events.registrar--checkpoints.1.7.7.1764620000000000000.0.r4nd0m",
    ],
)
def test_counts_read_from_the_ack_subject_agree_with_nats_py(reply: str) -> None:
    meta = Msg.Metadata._from_reply(reply)
    assert delivery.counts(reply) == (meta.num_delivered, meta.sequence.stream)


@pytest.mark.parametrize(
    "reply",
    [
        None,
        "",
        "_INBOX.abc.1",
        "$JS.ACK.too.short",
        "$JS.ACK.s.c.x.1.1.1.0",
        "$JS.NAK.s.c.1.1.1.1.0",
    ],
)
def test_what_is_no_ack_subject_has_no_counts(reply: str | None) -> None:
    assert delivery.counts(reply) is None


def test_a_failure_waits_its_back_off() -> None:
    for attempts in (1, 2, 3, 4):
        for waits in (False, True):
            if waits and attempts >= 3:
                continue  # the last two naks of a dependency wait: below
            delay = delivery.nak_delay(
                7.0, attempts, 5, waits_for_earlier=waits, age_s=1.0, bound_s=201.0
            )
            assert delay == 7.0


def test_the_last_wait_for_an_earlier_event_lasts_until_it_can_have_come_back() -> None:
    # max_deliver 5: the 4th delivery's nak is the last; the 5th delivery dead-letters.
    assert delivery.nak_delay(30.0, 4, 5, waits_for_earlier=True, age_s=51.0, bound_s=201.0) == 150
    # The one before it waits so too: a delivery lost in a pull can skip the 4th.
    assert delivery.nak_delay(15.0, 3, 5, waits_for_earlier=True, age_s=21.0, bound_s=201.0) == 180
    # Already that old: the back-off alone.
    assert delivery.nak_delay(30.0, 4, 5, waits_for_earlier=True, age_s=300.0, bound_s=201.0) == 30
    # Any other failure's last nak is its back-off.
    assert delivery.nak_delay(30.0, 4, 5, waits_for_earlier=False, age_s=51.0, bound_s=201.0) == 30


def test_the_redelivery_bound_is_every_delivery_held_to_ack_wait_and_the_back_off() -> None:
    cfg = BusConfig(
        url="nats://127.0.0.1:4222", ack_wait_s=30.0, max_deliver=5, backoff_s=(1, 5, 15, 30)
    )
    assert cfg.redelivery_bound_s == 5 * 30 + 1 + 5 + 15 + 30
    short = BusConfig(url="nats://127.0.0.1:4222", ack_wait_s=5.0, max_deliver=4, backoff_s=(1,))
    assert short.redelivery_bound_s == 4 * 5 + 3 * 1  # the last back-off repeats


@pytest.mark.parametrize(
    ("version", "flagged"),
    [
        ((2, 9, 10), True),  # Debian bookworm's nats-server
        ((2, 10, 14), True),
        ((2, 10, 15), True),
        ((2, 10, 16), False),
        ((2, 11, 0), False),
        ((2, 15, 1), False),
        ((0, 0, 0), False),  # unknown: not flagged
    ],
)
def test_servers_whose_delivery_counts_can_go_back_are_flagged(
    version: tuple[int, int, int], flagged: bool
) -> None:
    assert delivery.counts_may_go_back(version) is flagged
