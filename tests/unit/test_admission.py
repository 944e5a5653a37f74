"""`admit`: the one check every consumer and every replay of the stream applies."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from ckpt_ha.bus.admission import admit, job_key
from ckpt_ha.bus.batching import admit_recent
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG, Envelope, EventData, framing
from ckpt_ha.contracts.errors import ForgedEvent, SubjectMismatch, UnsignedEvent
from tests.support.events import committed, verified

MASTER = bytes(range(16, 48))
CFG = BusConfig(prefix="px", signing_keys=(MASTER,))


def subject_of(event: Envelope[EventData]) -> str:
    return framing.subject(CFG.prefix, event)


def test_what_a_process_with_the_master_key_publishes_is_admitted() -> None:
    event = committed("c1", job="job-9")
    body = event.to_bytes()
    headers = framing.headers(event.id, subject_of(event), body, key=job_key(CFG, event))
    assert admit(CFG, CATALOG, body, subject_of(event), headers).data.job_id == "job-9"
    # A key the consumer does not hold: forged.
    other = BusConfig(prefix="px", signing_keys=(bytes(32),))
    with pytest.raises(ForgedEvent):
        admit(other, CATALOG, body, subject_of(event), headers)


def test_service_events_need_no_signature_but_must_match_their_subject() -> None:
    event = verified("c1", job="job-9")
    body = event.to_bytes()
    assert job_key(CFG, event) is None  # not a type a job publishes
    assert admit(CFG, CATALOG, body, subject_of(event), None).data.job_id == "job-9"
    with pytest.raises(SubjectMismatch, match="not an event subject"):
        admit(CFG, CATALOG, body, "px.dlq.x.y", None)


def test_events_stored_before_signing_existed_are_accepted_only_below_the_upgrade_point() -> None:
    upgraded = BusConfig(prefix="px", signing_keys=(MASTER,), unsigned_before_seq=100)
    event = committed("c1")
    body, subject = event.to_bytes(), subject_of(event)
    assert admit(upgraded, CATALOG, body, subject, None, stream_seq=99).data.checkpoint_id == "c1"  # type: ignore[attr-defined]
    with pytest.raises(UnsignedEvent):
        admit(upgraded, CATALOG, body, subject, None, stream_seq=100)
    with pytest.raises(UnsignedEvent):
        admit(upgraded, CATALOG, body, subject, None)  # no sequence (a live watch): never


def test_a_message_two_batch_consumers_fetch_is_admitted_once_and_refusals_every_time() -> None:
    """`batching.admit_recent`: the same stored message (subject, sequence, body, headers)
    fetched by a second consumer of the same bus gets the event the first admitted; anything
    that differs, another bus's settings, or a refusal is admitted (or refused) anew."""
    event = committed("c1", job="job-9")
    body, subject = event.to_bytes(), subject_of(event)
    headers = framing.headers(event.id, subject, body, key=job_key(CFG, event))

    def fetched(data: bytes = body, sent: dict[str, str] | None = headers) -> Msg:
        return Msg(None, subject=subject, data=data, headers=dict(sent) if sent else None)  # type: ignore[arg-type]

    first = admit_recent(CFG, CATALOG, fetched(), 7)
    assert admit_recent(CFG, CATALOG, fetched(), 7) is first  # the other consumer's fetch
    assert admit_recent(CFG, CATALOG, fetched(), 8) is not first  # another stored message
    assert admit_recent(CFG, CATALOG, fetched(), 8) == first
    other = BusConfig(prefix="px", signing_keys=(bytes(32),))
    for _ in range(2):
        with pytest.raises(ForgedEvent):
            admit_recent(other, CATALOG, fetched(), 7)
    forged = {**headers, framing.SIGNATURE: "0" * 64}
    for _ in range(2):
        with pytest.raises(ForgedEvent):
            admit_recent(CFG, CATALOG, fetched(sent=forged), 7)
    with pytest.raises(UnsignedEvent):
        admit_recent(CFG, CATALOG, fetched(sent=None), 7)
