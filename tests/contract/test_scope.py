"""Subjects, bodies and job signatures agree, or the event is refused (pure: no broker)."""

from __future__ import annotations

import pytest

from ckpt_ha.contracts import CATALOG, framing, signing
from ckpt_ha.contracts.errors import ForgedEvent, SubjectMismatch, UnsignedEvent
from ckpt_ha.contracts.subjects import EventAddress, event_subject, parse_event_subject
from tests.support.events import committed, expired

MASTER = bytes(range(32))


@pytest.mark.parametrize("job", ["job-1", "a.b", "x y", "*", ">", "ü", "~41", "a/b"])
def test_a_subject_names_its_type_version_and_job(job: str) -> None:
    subject = event_subject("px", "checkpoint.committed", 3, job)
    assert parse_event_subject("px", subject) == EventAddress("checkpoint.committed", 3, job)


@pytest.mark.parametrize(
    "subject",
    [
        "px.ev.checkpoint.committed.v1",  # no job token
        "other.ev.checkpoint.committed.v1.j",  # another deployment's prefix
        "px.dlq.checkpoint.committed.v1.j",
        "px.ev.checkpoint.committed.1.j",
        "px.ev.checkpoint.committed.v0.j",
        "px.ev.checkpoint.committed.v1.a~2",  # a broken escape
        "px.ev.checkpoint.committed.v1.~61",  # 'a' spelled escaped: not the canonical token
    ],
)
def test_anything_else_is_not_an_event_subject(subject: str) -> None:
    assert parse_event_subject("px", subject) is None


def test_the_body_must_agree_with_its_subject() -> None:
    raw = committed("c1", job="job-1").to_bytes()
    assert (
        CATALOG.decode(raw, EventAddress("checkpoint.committed", 1, "job-1")).data.job_id == "job-1"
    )
    for address in (
        EventAddress("checkpoint.expired", 1, "job-1"),
        EventAddress("checkpoint.committed", 2, "job-1"),
        EventAddress("checkpoint.committed", 1, "job-2"),
    ):
        with pytest.raises(SubjectMismatch):
            CATALOG.decode(raw, address)
    with pytest.raises(SubjectMismatch, match=r"the subject says checkpoint\.committed"):
        CATALOG.decode(expired("c1").to_bytes(), EventAddress("checkpoint.committed", 1, "job-1"))


def test_only_the_jobs_own_key_signs_for_it() -> None:
    subject, body = "px.ev.checkpoint.committed.v1.job-1", b"{}"
    own = {framing.SIGNATURE: framing.signature(signing.job_key(MASTER, "job-1"), subject, body)}
    framing.verify([MASTER], "job-1", subject, body, own)
    framing.verify([bytes(32), MASTER], "job-1", subject, body, own)  # during a rotation
    with pytest.raises(UnsignedEvent):
        framing.verify([MASTER], "job-1", subject, body, {})
    other = {framing.SIGNATURE: framing.signature(signing.job_key(MASTER, "job-2"), subject, body)}
    with pytest.raises(ForgedEvent):
        framing.verify([MASTER], "job-1", subject, body, other)
    with pytest.raises(ForgedEvent):  # the same signature moved to another subject
        framing.verify([MASTER], "job-1", subject.replace("v1", "v2"), body, own)
    with pytest.raises(ForgedEvent):  # or over other bytes
        framing.verify([MASTER], "job-1", subject, b"{ }", own)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        signing.parse_master("abcd")
