"""Integrity-checker decisions (pure): the skip rule, verdicts, and what a scrub concludes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointFormat,
    CheckpointQuarantinedV1,
    CheckpointState,
    CheckpointVerifiedV1,
    FailureSide,
)
from ckpt_ha.core.records import CheckpointRecord, HistoryEntry, checksums_from_checks
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.integrity_checker import domain

S = CheckpointState
COMMITTED = CheckpointCommittedV1(
    job_id="job-1", checkpoint_id="job-1-abc", uri="file:///r/job-1/step-1", run_id="r",
    step=1, format=CheckpointFormat.NATIVE,
)  # fmt: skip


@pytest.mark.parametrize(
    ("state", "verify"),
    [(None, True), (S.WRITING, True), (S.PENDING_VERIFICATION, True), (S.VALID, False),
     (S.CORRUPT, False), (S.QUARANTINED, False), (S.WRITE_FAILED, False), (S.EXPIRED, False),
     (S.DELETED, False)],
)  # fmt: skip
def test_only_checkpoints_awaiting_a_verdict_are_verified(state: S | None, verify: bool) -> None:
    assert domain.should_verify(state) is verify


def report(checksums: dict[str, str], *, fail: str | None = None) -> Report:
    r = Report(format=CheckpointFormat.NATIVE, checksums=checksums, checks=["sizes"])
    if fail:
        r.fail(Verdict.CORRUPT, fail)
    return r


def test_verified_checks_carry_checksums_the_registry_can_read_back() -> None:
    sums = {"a.bin": "xxh3_64:00ff", "dir/x=y.bin": "sha256:abcd"}
    [verified] = domain.outcome(COMMITTED, report(sums))
    assert isinstance(verified, CheckpointVerifiedV1)
    assert checksums_from_checks(verified.checks) == sums


def test_checksums_from_checks_ignores_other_checks() -> None:
    checks = ["sizes", "checksums:xxh3_64", "manifest", "=xxh3_64:00", "a.bin=nodigest"]
    assert checksums_from_checks(checks) == {}


def test_failed_verification_is_corrupt_then_quarantined() -> None:
    corrupt, quarantined = domain.outcome(COMMITTED, report({}, fail="a.bin: checksum mismatch"))
    assert isinstance(corrupt, CheckpointCorruptV1)
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert corrupt.reason == "corrupt: a.bin: checksum mismatch"
    assert corrupt.side is FailureSide.JOB
    assert quarantined.reason == "integrity check failed: corrupt: a.bin: checksum mismatch"


RECORDED = {"a.bin": "xxh3_64:1111", "b.bin": "xxh3_64:2222"}


def scrub(found: Report) -> list[object]:
    return list(
        domain.scrub_outcome(
            job_id="job-1", checkpoint_id="job-1-abc", uri="file:///r", recorded=RECORDED,
            report=found,
        )
    )  # fmt: skip


def test_an_intact_checkpoint_scrubs_clean() -> None:
    assert scrub(report(dict(RECORDED))) == []
    # Verified with another algorithm than today's setting: only the verdict counts.
    assert scrub(report({"a.bin": "sha256:ffff", "b.bin": "sha256:eeee"})) == []


def test_a_changed_checksum_names_the_file_and_both_digests() -> None:
    corrupt, quarantined = scrub(report({**RECORDED, "b.bin": "xxh3_64:9999"}))
    assert isinstance(corrupt, CheckpointCorruptV1)
    assert isinstance(quarantined, CheckpointQuarantinedV1)
    assert corrupt.reason == (
        "scrub: b.bin: checksum changed (expected xxh3_64:2222, found xxh3_64:9999)"
    )
    assert corrupt.side is FailureSide.INFRASTRUCTURE


def test_a_missing_file_and_a_failed_verdict_are_corrupt() -> None:
    corrupt, _ = scrub(report({"a.bin": "xxh3_64:1111"}))
    assert isinstance(corrupt, CheckpointCorruptV1)
    assert "b.bin: missing (expected xxh3_64:2222" in corrupt.reason
    corrupt, _ = scrub(report(dict(RECORDED), fail="manifest unreadable"))
    assert isinstance(corrupt, CheckpointCorruptV1)
    assert corrupt.findings == ("corrupt: manifest unreadable",)


def test_with_nothing_recorded_the_verdict_alone_decides() -> None:
    found = report({}, fail="a.bin: size 3, want 4")
    [corrupt, _] = domain.scrub_outcome(
        job_id="j", checkpoint_id="j-1", uri="file:///r", recorded={}, report=found
    )
    assert isinstance(corrupt, CheckpointCorruptV1)
    assert (
        domain.scrub_outcome(
            job_id="j", checkpoint_id="j-1", uri="file:///r", recorded={}, report=report({})
        )
        == []
    )


# --- which checkpoints lost their verdict --------------------------------------------------------

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DEADLINE = timedelta(minutes=30)


def record(*steps: tuple[S, str, str, datetime]) -> CheckpointRecord:
    """A record with the history ``steps`` of (state, event type, event id, at)."""
    history = tuple(
        HistoryEntry(state=s, at=at, event_id=eid, event_type=etype, actor="t")
        for s, etype, eid, at in steps
    )
    return CheckpointRecord(
        checkpoint_id="job-1-abc", job_id="job-1", uri="file:///r/job-1/step-1",
        state=history[-1].state, created_at=T0, updated_at=history[-1].at, history=history,
    )  # fmt: skip


def test_a_checkpoint_pending_past_the_deadline_is_re_driven_with_its_commit_as_cause() -> None:
    pending = record((S.PENDING_VERIFICATION, "checkpoint.committed", "commit-1", T0))
    assert (
        domain.overdue_verification(pending, T0 + DEADLINE - timedelta(seconds=1), DEADLINE) is None
    )
    overdue = domain.overdue_verification(pending, T0 + DEADLINE, DEADLINE)
    assert overdue == domain.Overdue("job-1-abc", "commit-1", released=False, since=T0)


def test_a_release_pending_past_the_deadline_is_re_driven_as_a_release() -> None:
    later = T0 + timedelta(days=1)
    released = record(
        (S.PENDING_VERIFICATION, "checkpoint.committed", "commit-1", T0),
        (S.CORRUPT, "checkpoint.corrupt", "corrupt-1", T0),
        (S.QUARANTINED, "checkpoint.quarantined", "q-1", T0),
        (S.PENDING_VERIFICATION, "checkpoint.released", "release-1", later),
    )
    # The deadline counts from the release, not from the first commit.
    assert domain.overdue_verification(released, later + timedelta(minutes=1), DEADLINE) is None
    overdue = domain.overdue_verification(released, later + DEADLINE, DEADLINE)
    assert overdue == domain.Overdue("job-1-abc", "release-1", released=True, since=later)


@pytest.mark.parametrize("state", [S.WRITING, S.VALID, S.CORRUPT, S.QUARANTINED, S.WRITE_FAILED])
def test_only_pending_checkpoints_are_overdue(state: S) -> None:
    moved = record(
        (S.PENDING_VERIFICATION, "checkpoint.committed", "commit-1", T0),
        (state, "checkpoint.x", "x-1", T0),
    )
    assert domain.overdue_verification(moved, T0 + 10 * DEADLINE, DEADLINE) is None
