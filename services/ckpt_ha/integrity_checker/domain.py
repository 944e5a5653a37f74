"""Integrity decisions: a verification report becomes the events that state it. Pure.

Four decisions live here: whether a `committed` event still needs verifying (`should_verify`),
what a verification concluded (`outcome`), what a periodic scrub of a valid checkpoint
concluded against the checksums recorded when it was verified (`scrub_outcome`), and which
checkpoints waited too long for a verdict (`overdue_verification`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from ckpt_ha.contracts.checkpoint import (
    CheckpointReleasedV1,
    CheckpointState,
    CheckpointVerifiedV1,
    CopyState,
    FailureSide,
)
from ckpt_ha.contracts.envelope import EventData
from ckpt_ha.core.copies import CopyRecord, valid_copies
from ckpt_ha.core.corruption import condemn
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats.report import Report, Verdict

ALL_COPIES_LOST = "all copies lost"
"""The reason a checkpoint that had copies is corrupt once none of them is left valid."""

# Every verdict but `valid` is the job's output being wrong or incomplete; storage outages never
# reach here (they are retried), so infrastructure-side failures show up as write_failed instead.
_SIDE = {
    Verdict.CORRUPT: FailureSide.JOB,
    Verdict.INCOMPLETE: FailureSide.JOB,
    Verdict.UNSAFE: FailureSide.JOB,
    Verdict.UNKNOWN: FailureSide.UNKNOWN,
}

AWAITING_VERIFICATION = frozenset(
    {None, CheckpointState.WRITING, CheckpointState.PENDING_VERIFICATION}
)
"""Registry states in which a `committed` event is still worth verifying. Anything later
(valid, corrupt, quarantined, write-failed, expired, deleted) was decided already: a duplicate
or late `committed` (the writer and the watcher both announce; a watcher restarts) is skipped
instead of re-reading every shard, and can no longer produce an illegal transition."""


def should_verify(state: CheckpointState | None) -> bool:
    """Verify unless the registry already holds a verdict (or a later state) for it."""
    return state in AWAITING_VERIFICATION


def release_step(
    release: CheckpointReleasedV1, state: CheckpointState | None, released_by: str | None
) -> str:
    """What to do with a `released` event, from the registry's record: ``verify`` once the
    registrar has applied this release (the record is pending verification through it),
    ``wait`` while it has not (the checker may hear the event first), ``skip`` when the record
    moved on (already verified again, expired, deleted) or never existed."""
    if state is CheckpointState.QUARANTINED:
        return "wait"
    if state is CheckpointState.PENDING_VERIFICATION and released_by is not None:
        return "verify"
    return "skip"


def release_decision(
    event_id: str, release: CheckpointReleasedV1, record: CheckpointRecord | None
) -> str:
    """`release_step` from the registry's record: the registrar applied this release when the
    record's latest history entry is this event."""
    released_by = None
    if record is not None and record.history and record.history[-1].event_id == event_id:
        released_by = event_id
    return release_step(release, record.state if record is not None else None, released_by)


def scrub_key(record: CheckpointRecord) -> str:
    """The id key of a scrub's verdict on ``record``: keyed on the verification it contradicts,
    so a repeated scrub of the same bytes publishes the same ids (deduplicated)."""
    return f"scrub|{record.history[-1].event_id if record.history else ''}"


def scrub_order(
    records: Iterable[CheckpointRecord], resume_after: str | None
) -> list[CheckpointRecord]:
    """The checkpoints a scrub round reads, in id order: after ``resume_after`` when the last
    round stopped there (outage or time limit), so a pass reaches every checkpoint however
    often it is cut short; a checkpoint that became valid behind that point waits for the
    next pass."""
    ordered = sorted(records, key=lambda record: record.checkpoint_id)
    if resume_after is None:
        return ordered
    return [record for record in ordered if record.checkpoint_id > resume_after]


def still_scrubbed(current: CheckpointRecord | None) -> bool:
    """Report a scrub's finding only while the checkpoint is still valid: one that moved on
    while it was read (expired, deleted, quarantined) is not the scrub's any more."""
    return current is not None and current.state is CheckpointState.VALID


class Verified(Protocol):
    """What a verdict names: the checkpoint, its job and its location (a `committed` or
    `released` event, or the registry's record when a verification is re-driven)."""

    @property
    def job_id(self) -> str: ...

    @property
    def checkpoint_id(self) -> str: ...

    @property
    def uri(self) -> str: ...


def outcome(committed: Verified, report: Report) -> list[EventData]:
    """`verified` with the checks that passed, or `corrupt` + `quarantined` with the findings.

    A corrupt checkpoint is tagged into quarantine at once so it is never offered again, and
    the same bad version is not retried (R7).
    """
    if report.ok:
        checks = (*report.checks, *(f"{f}={d}" for f, d in sorted(report.checksums.items())))
        return [
            CheckpointVerifiedV1(
                job_id=committed.job_id,
                checkpoint_id=committed.checkpoint_id,
                uri=committed.uri,
                checks=checks,
                exact_resume=report.exact_resume is not False,
                bytes_verified=report.bytes_read,
            )
        ]
    reason = f"{report.verdict.value}: {report.reasons[0] if report.reasons else 'no detail'}"
    return list(
        condemn(
            job_id=committed.job_id,
            checkpoint_id=committed.checkpoint_id,
            uri=committed.uri,
            reason=reason,
            side=_SIDE[report.verdict],
            findings=report.reasons,
            why_quarantined=f"integrity check failed: {reason}",
        )
    )


def _algorithm(digest: str) -> str:
    return digest.partition(":")[0]


def scrub_findings(recorded: Mapping[str, str], report: Report) -> list[str]:
    """What a re-verification found wrong against the checksums recorded at verification.

    A file is compared only when both sides used the same algorithm (the checker's setting may
    have changed since); a recorded file the report has no checksum for is missing.
    """
    findings: list[str] = []
    for path, expected in sorted(recorded.items()):
        found = report.checksums.get(path)
        if found is None:
            if report.ok:
                findings.append(f"{path}: missing (expected {expected}, found no file)")
        elif _algorithm(found) == _algorithm(expected) and found != expected:
            findings.append(f"{path}: checksum changed (expected {expected}, found {found})")
    if not report.ok:
        findings.extend(f"{report.verdict.value}: {r}" for r in report.reasons or ["no detail"])
    return findings


def scrub_outcome(
    *,
    job_id: str,
    checkpoint_id: str,
    uri: str,
    recorded: Mapping[str, str],
    report: Report,
    copies: Mapping[str, CopyRecord] | None = None,
) -> list[EventData]:
    """Nothing while a valid checkpoint still matches; else `corrupt` + `quarantined`.

    Bytes that change after verification are the platform's problem (bit rot, a bad disk, an
    overwrite by someone else), not the job's: the side is infrastructure. With ``copies`` (a
    tier that replicates) the reason says what is left: the verified copy a restore now uses,
    or ``all copies lost`` when every copy it had is gone too.
    """
    findings = scrub_findings(recorded, report)
    if not findings:
        return []
    reason = f"scrub: {findings[0]}"
    good = valid_copies(copies or {})
    if good:
        reason += f"; restorable from its verified copy {good[0].uri}"
    elif copies:
        reason = f"{ALL_COPIES_LOST}: {reason}"
    return list(
        condemn(
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            uri=uri,
            reason=reason,
            side=FailureSide.INFRASTRUCTURE,
            findings=findings,
            why_quarantined=f"re-verification failed: {findings[0]}",
        )
    )


def without(copies: Mapping[str, CopyRecord], failed: Iterable[str]) -> dict[str, CopyRecord]:
    """``copies`` with the ``failed`` ones no longer valid (a scrub found them bad just now,
    before the registry heard it)."""
    bad = set(failed)
    return {
        uri: c.model_copy(update={"state": CopyState.CORRUPT}) if uri in bad else c
        for uri, c in copies.items()
    }


def verdict_key(checkpoint_id: str, cause: str, *, released: bool) -> str:
    """What a verdict's event ids derive from. A commit's verdict: the checkpoint, since one
    write is announced twice (by the writer and by the watcher) and two checker replicas may
    verify both announcements at once: JetStream's duplicate window keeps one verdict. A
    release's: the release (``cause``), since a checkpoint released again is verified again."""
    return cause if released else f"verify-commit:{checkpoint_id}"


@dataclass(frozen=True)
class Overdue:
    """A checkpoint pending verification past the deadline: its verdict never reached the
    registry (the checker's delivery was dead-lettered during an outage longer than the retry
    budget, or the registrar's delivery of the verdict was)."""

    checkpoint_id: str
    cause: str
    """The id of the event that asked for the verification (the `committed` or `released` the
    registry applied): the verdict's id is derived from it (`verdict_key`), as the live handler
    derives it, so a re-driven verdict is the same event as the lost one and is applied once."""
    released: bool
    """The verification of a release: the bytes come back from quarantine first."""
    since: datetime


def overdue_verification(
    record: CheckpointRecord, now: datetime, deadline: timedelta
) -> Overdue | None:
    """The re-drive a record needs: it is pending verification since longer than ``deadline``
    (counted from the event that made it pending). None otherwise."""
    if record.state is not CheckpointState.PENDING_VERIFICATION:
        return None
    entry = next(
        (h for h in reversed(record.history) if h.state is CheckpointState.PENDING_VERIFICATION),
        None,
    )
    if entry is None or now - entry.at < deadline:
        return None
    return Overdue(
        checkpoint_id=record.checkpoint_id,
        cause=entry.event_id,
        released=entry.event_type == CheckpointReleasedV1.EVENT_TYPE,
        since=entry.at,
    )
