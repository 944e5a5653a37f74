"""The registry's pure projection: fields, history and order, without Redis."""

from __future__ import annotations

import pytest

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointConflictV1,
    CheckpointCorruptV1,
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointFormat,
    CheckpointPinnedV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointUnpinnedV1,
    CheckpointVerifiedV1,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
)
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.lifecycle import IllegalTransition
from ckpt_ha.core.locations import JobMismatch
from ckpt_ha.core.records import CheckpointRecord, project, project_batch
from tests.support.events import T0, committed, deleted, expired, verified


def test_committed_creates_a_pending_record() -> None:
    event = committed("c1", step=42)
    record, step = project(None, event)
    assert record is not None
    assert step is not None
    assert step.changed
    assert record.state is CheckpointState.PENDING_VERIFICATION
    assert record.step == 42
    assert record.created_at == event.time
    assert [h.event_id for h in record.history] == [event.id]


def test_verified_before_committed_waits() -> None:
    with pytest.raises(DependencyNotReady):
        project(None, verified("c1"))


def test_repeat_transition_changes_nothing() -> None:
    record, _ = project(None, committed("c1"))
    again, step = project(record, committed("c1", key="other"))
    assert again == record
    assert step is not None
    assert not step.changed


def test_full_life_and_illegal_resurrection() -> None:
    record = None
    for event in (committed("c1"), verified("c1"), expired("c1"), deleted("c1")):
        record, _ = project(record, event)
    assert record is not None
    assert record.state is CheckpointState.DELETED
    assert record.exact_resume is True
    assert [h.state for h in record.history] == [
        CheckpointState.PENDING_VERIFICATION,
        CheckpointState.VALID,
        CheckpointState.EXPIRED,
        CheckpointState.DELETED,
    ]
    with pytest.raises(IllegalTransition):
        project(record, committed("c1", key="resubmitted"))


def test_verified_records_the_checksums_a_scrub_compares_against() -> None:
    record, _ = project(None, committed("c1"))
    event = build(
        CheckpointVerifiedV1(
            job_id="job-1", checkpoint_id="c1", uri="file:///data/job-1/step-100",
            checks=("sizes", "checksums:xxh3_64", "a.bin=xxh3_64:00ff", "b/c.bin=sha256:abcd"),
        ),
        source="test/checker", time=T0, key="k",
    )  # fmt: skip
    record, _ = project(record, event)
    assert record is not None
    assert record.checksums == {"a.bin": "xxh3_64:00ff", "b/c.bin": "sha256:abcd"}
    assert project(None, committed("c2"))[0].checksums == {}  # type: ignore[union-attr]


# --- records belong to their job ----------------------------------------------------------------


def _about(ckpt: str, job: str) -> list[EventData]:
    """Every checkpoint event that changes a record, for ``job`` about checkpoint ``ckpt``."""
    base = {"job_id": job, "checkpoint_id": ckpt, "uri": f"file:///data/{job}/step-100"}
    return [
        CheckpointWritingV1(**base, run_id="r"),
        CheckpointCommittedV1(**base, run_id="r", step=100, format=CheckpointFormat.NATIVE),
        CheckpointWriteFailedV1(**base, reason="r"),
        CheckpointVerifiedV1(**base, checks=("sizes",)),
        CheckpointCorruptV1(**base, reason="r"),
        CheckpointQuarantinedV1(**base, reason="r"),
        CheckpointReleasedV1(**base, reason="r", actor="mallory"),
        CheckpointExpiredV1(**base, reason="r", policy="p"),
        CheckpointDeletedV1(**base, reason="r", actor="mallory"),
        CheckpointPinnedV1(**base, by="eval", reason="r", actor="mallory"),
        CheckpointUnpinnedV1(**base, by="eval", reason="r", actor="mallory"),
    ]


@pytest.mark.parametrize("state", [CheckpointState.PENDING_VERIFICATION, CheckpointState.VALID])
def test_an_event_of_another_job_changes_nothing_of_a_record(state: CheckpointState) -> None:
    events = [committed("a1", job="job-a")]
    if state is CheckpointState.VALID:
        events.append(verified("a1", job="job-a"))
    record = None
    for event in events:
        record, _ = project(record, event)
    assert record is not None
    for n, data in enumerate(_about("a1", "job-b")):
        event = build(data, source="test/mallory", time=T0, key=f"m{n}")
        with pytest.raises(JobMismatch) as refused:
            project(record, event)
        assert (refused.value.code, refused.value.job_id) == ("job_mismatch", "job-b")
        outcome = project_batch([event], [False], {"a1": record}, {}, {})
        assert isinstance(outcome.results[0], JobMismatch)
        assert (outcome.fresh, outcome.records) == ([], {})  # nothing written


def test_a_report_about_another_jobs_checkpoint_is_no_refusal() -> None:
    """The registrar's own conflict names the refused event's job: consuming it must not
    refuse (and report) again."""
    record, _ = project(None, committed("a1", job="job-a"))
    conflict = build(
        CheckpointConflictV1(job_id="job-b", checkpoint_id="a1", uri="file:///x", reason="r"),
        source="ckpt-ha/registrar", time=T0, key="c",
    )  # fmt: skip
    assert project(record, conflict) == (record, None)


def test_a_commit_declaring_another_jobs_identity_is_refused() -> None:
    event = committed("b1", job="job-b", project="vision")
    assert isinstance(event.data, CheckpointCommittedV1)
    assert event.data.identity is not None
    claim = event.data.model_copy(
        update={"identity": event.data.identity.model_copy(update={"job_id": "job-a"})}
    )
    with pytest.raises(JobMismatch, match="identity names job 'job-a'"):
        project(None, build(claim, source="test", time=T0, key="k"))


# --- replicas of the registrar: a report heard before the event it follows ----------------------


def _event(data: EventData, key: str) -> Envelope[EventData]:
    return build(data, source="test", time=T0, key=key)


def _at(state: CheckpointState, ckpt: str = "c9") -> CheckpointRecord:
    """A record of ``ckpt`` brought to ``state`` by the events that lead there."""
    base = {"job_id": "job-1", "checkpoint_id": ckpt, "uri": "file:///data/job-1/step-100"}
    path: dict[CheckpointState, list[EventData]] = {
        CheckpointState.WRITING: [CheckpointWritingV1(**base, run_id="r")],
        CheckpointState.PENDING_VERIFICATION: [
            CheckpointCommittedV1(**base, run_id="r", step=100, format=CheckpointFormat.NATIVE)
        ],
    }
    path[CheckpointState.VALID] = [
        *path[CheckpointState.PENDING_VERIFICATION],
        CheckpointVerifiedV1(**base, checks=("sizes",)),
    ]
    path[CheckpointState.QUARANTINED] = [
        *path[CheckpointState.PENDING_VERIFICATION],
        CheckpointCorruptV1(**base, reason="r"),
        CheckpointQuarantinedV1(**base, reason="r"),
    ]
    record: CheckpointRecord | None = None
    for n, data in enumerate(path[state]):
        record, _ = project(record, _event(data, f"k{n}"))
    assert record is not None
    assert record.state is state
    return record


@pytest.mark.parametrize(
    ("state", "late"),
    [
        (CheckpointState.WRITING, CheckpointVerifiedV1),
        (CheckpointState.WRITING, CheckpointCorruptV1),
        (CheckpointState.PENDING_VERIFICATION, CheckpointQuarantinedV1),
        (CheckpointState.VALID, CheckpointDeletedV1),
    ],
)
def test_a_report_heard_before_the_event_it_follows_waits_for_it(
    state: CheckpointState, late: type[EventData]
) -> None:
    """Two registrar replicas share the deliveries: the event before a report may still be in
    the other replica's batch. The report waits (nak'ed, retried), it is not refused."""
    base = {"job_id": "job-1", "checkpoint_id": "c9", "uri": "file:///data/job-1/step-100"}
    extra = {
        CheckpointVerifiedV1: {"checks": ("sizes",)},
        CheckpointCorruptV1: {"reason": "r"},
        CheckpointQuarantinedV1: {"reason": "r"},
        CheckpointDeletedV1: {"reason": "r", "actor": "janitor"},
    }[late]
    with pytest.raises(DependencyNotReady):
        project(_at(state), _event(late(**base, **extra), "late"))


def test_a_report_no_stage_leads_to_is_still_refused() -> None:
    """Verified after quarantined is no report out of order: nothing it waits for would come."""
    base = {"job_id": "job-1", "checkpoint_id": "c9", "uri": "file:///data/job-1/step-100"}
    with pytest.raises(IllegalTransition):
        project(
            _at(CheckpointState.QUARANTINED),
            _event(CheckpointVerifiedV1(**base, checks=("sizes",)), "late"),
        )


def test_an_event_in_its_records_history_is_a_duplicate_the_applied_window_forgot() -> None:
    """The registry's window of applied ids forgets; the record's history does not: an event
    that changed the record, heard again after the window (``seen`` False), changes nothing."""
    first, verdict = committed("c1"), verified("c1")
    record, _ = project(None, first)
    record, _ = project(record, verdict)
    assert record is not None
    for again in (first, verdict):
        outcome = project_batch([again], [False], {"c1": record}, {"job-1": None}, {}, {})
        [result] = outcome.results
        assert not isinstance(result, Exception)
        assert result.duplicate
        assert result.record == record
        assert (outcome.fresh, outcome.records) == ([], {})
