"""Which deliveries count against the retry cap, and which messages are parked. Pure.

A rolling upgrade runs old and new consumers on one durable at once. An event of a version
newer than a consumer's catalogue knows is *parked*: nak'ed with a long delay
(``BusConfig.park_delay_s``), never handled, never dead-lettered for being new, so that it stays
in the durable until a consumer that knows the version takes it. An older version that is not
known (retired, or a gap) and an unknown type are still refused: no consumer will ever know them.

Parking needs JetStream's own ``max_deliver`` unlimited (it would stop redelivering a parked
message), so the bus enforces the cap itself (`ckpt_ha.bus.dead_letter_policy.DeadLetters`).
Every park is a JetStream delivery too, so a message an old consumer parked ten times would reach
a new consumer already past the cap. `attempts` therefore excuses the deliveries parking can
explain: a message can have been parked at most once per ``park_delay_s`` since it was stored,
and only if its version is newer than its type's first (a first version is known to every
consumer of the type, so it is never parked). What is left are the deliveries that reached a
handler (or were lost in a pull): those count.

The bound is conservative the other way: a message of a later version that waited long in the
stream before its first delivery (a consumer down for hours) is excused as many deliveries as it
waited park delays, so if its handler crashes every time it is dead-lettered only after that many
more. First versions, which are almost every event, are counted exactly.
"""

from __future__ import annotations

import math
from datetime import datetime

from ckpt_ha.contracts import EventCatalog
from ckpt_ha.contracts.errors import UnsupportedEventVersion
from ckpt_ha.contracts.subjects import EventAddress


def newer_than_known(error: BaseException, where: EventAddress | None) -> bool:
    """True for an event of a known type whose version is newer than every version this
    consumer knows, published on the subject of that version (``where``): it is parked, not
    refused. A body claiming another version than its subject is refused as it always was."""
    return (
        isinstance(error, UnsupportedEventVersion)
        and bool(error.known)
        and error.version > max(error.known)
        and where is not None
        and (where.event_type, where.version) == (error.event_type, error.version)
    )


def parks_here(catalog: EventCatalog, where: EventAddress | None) -> bool:
    """True when this consumer would park the message (its subject names a known type at a
    version newer than any this catalogue knows)."""
    if where is None:
        return False
    known = catalog.versions(where.event_type)
    return bool(known) and where.version > known[-1]


def parkable(catalog: EventCatalog, where: EventAddress | None) -> bool:
    """True when an older consumer may have parked the message: its version is later than the
    first version this catalogue knows of its type."""
    if where is None:
        return False
    known = catalog.versions(where.event_type)
    return bool(known) and where.version > known[0]


def attempts(
    delivered: int, stored_at: datetime, now: datetime, *, parkable: bool, park_delay_s: float
) -> int:
    """Deliveries that count against the cap: ``delivered`` less those parking can explain
    (at most one per ``park_delay_s`` since the message was stored, and none unless
    ``parkable``). Never less than 1: this delivery counts."""
    if not parkable or delivered <= 1 or park_delay_s <= 0:
        return max(delivered, 1)
    waited = max((now - stored_at).total_seconds(), 0.0)
    excused = min(delivered - 1, math.floor(waited / park_delay_s))
    return delivered - excused


COUNTS_FIXED_IN = (2, 10, 16)
"""The first nats-server release whose delivery counts never go back (nats-server PR #5305):
before it, a redelivery that found only expired pull requests was put back as a new message,
its next delivery counted 1 again (before 2.10.14) or one number skipped (2.10.14-15). Pull
requests expire all the time here (a batch consumer's linger), so on such a server a handler can
run more than ``max_deliver`` times; `DeadLetters.past_cap` still dead-letters the message once
JetStream's count passes the cap."""


def counts_may_go_back(version: tuple[int, int, int]) -> bool:
    """Whether a nats-server of ``version`` (major, minor, patch) has that bug; (0, 0, 0), an
    unknown version, is not flagged."""
    return version != (0, 0, 0) and version < COUNTS_FIXED_IN


def nak_delay(
    backoff_s: float,
    attempts: int,
    max_deliver: int,
    *,
    waits_for_earlier: bool,
    age_s: float,
    bound_s: float,
) -> float:
    """How long a failed delivery waits before the next: its back-off (``backoff_s``), except
    the last nak of an event that waits for an earlier one (``waits_for_earlier``: a
    `DependencyNotReady` with ``in_stream``), which waits until the event is ``bound_s`` old
    (`BusConfig.redelivery_bound_s`). The earlier event may be held by a consumer that died
    with it, and JetStream gives it back only after ``ack_wait``; a back-off shorter than that
    would dead-letter the later event while the earlier one is still on its way. Short
    back-offs first, so an event heard a moment before its predecessor (two replicas) is not
    slowed. The last two naks wait so: a delivery JetStream counted but no consumer saw (lost
    in a pull) skips a number, and must not skip the only long wait."""
    if waits_for_earlier and attempts >= max_deliver - 2:
        return max(backoff_s, bound_s - age_s)
    return backoff_s


def counts(reply: str | None) -> tuple[int, int] | None:
    """(times delivered, stream sequence) read from a JetStream message's ack subject, None when
    it is not one. What a consumer needs of every message, without nats-py's full metadata (two
    frozen dataclasses and a datetime per message); anything else still reads that.

    The subject is ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>
    .<pending>``, or since nats-server 2.9 with ``<domain>.<account hash>`` after ``ACK`` and
    possibly a random token at the end (11 or more tokens).
    """
    tokens = reply.split(".") if reply else []
    if len(tokens) == _V1_TOKENS:
        at = 4
    elif len(tokens) >= _V2_TOKENS:
        at = 6
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    try:
        return int(tokens[at]), int(tokens[at + 1])
    except ValueError:
        return None


_V1_TOKENS = 9
_V2_TOKENS = 11
