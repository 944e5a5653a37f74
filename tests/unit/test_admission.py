"""`admit`: the one check every consumer and every replay of the stream applies."""

from __future__ import annotations

import pytest

from ckpt_ha.bus.admission import admit, signed_headers, subject_of
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.contracts import CATALOG
from ckpt_ha.contracts.errors import ForgedEvent, SubjectMismatch, UnsignedEvent
from tests.support.events import committed, verified

MASTER = bytes(range(16, 48))
CFG = BusConfig(prefix="px", signing_keys=(MASTER,))


def test_what_a_process_with_the_master_key_publishes_is_admitted() -> None:
    event = committed("c1", job="job-9")
    body = event.to_bytes()
    headers = signed_headers(CFG, event, body, {})
    assert admit(CFG, CATALOG, body, subject_of(CFG, event), headers).data.job_id == "job-9"
    # A key the consumer does not hold: forged.
    other = BusConfig(prefix="px", signing_keys=(bytes(32),))
    with pytest.raises(ForgedEvent):
        admit(other, CATALOG, body, subject_of(CFG, event), headers)


def test_service_events_need_no_signature_but_must_match_their_subject() -> None:
    event = verified("c1", job="job-9")
    body = event.to_bytes()
    assert signed_headers(CFG, event, body, {}) == {}  # not a type a job publishes
    assert admit(CFG, CATALOG, body, subject_of(CFG, event), None).data.job_id == "job-9"
    with pytest.raises(SubjectMismatch, match="not an event subject"):
        admit(CFG, CATALOG, body, "px.dlq.x.y", None)


def test_events_stored_before_signing_existed_are_accepted_only_below_the_upgrade_point() -> None:
    upgraded = BusConfig(prefix="px", signing_keys=(MASTER,), unsigned_before_seq=100)
    event = committed("c1")
    body, subject = event.to_bytes(), subject_of(CFG, event)
    assert admit(upgraded, CATALOG, body, subject, None, stream_seq=99).data.checkpoint_id == "c1"  # type: ignore[attr-defined]
    with pytest.raises(UnsignedEvent):
        admit(upgraded, CATALOG, body, subject, None, stream_seq=100)
    with pytest.raises(UnsignedEvent):
        admit(upgraded, CATALOG, body, subject, None)  # no sequence (a live watch): never
