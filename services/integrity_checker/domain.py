"""Integrity decisions: a verification report becomes the events that state it. Pure."""

from __future__ import annotations

from contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointQuarantinedV1,
    CheckpointVerifiedV1,
    FailureSide,
)
from contracts.envelope import EventData
from services.shared.formats.report import Report, Verdict

# Every verdict but `valid` is the job's output being wrong or incomplete; storage outages never
# reach here (they are retried), so infrastructure-side failures show up as write_failed instead.
_SIDE = {
    Verdict.CORRUPT: FailureSide.JOB,
    Verdict.INCOMPLETE: FailureSide.JOB,
    Verdict.UNSAFE: FailureSide.JOB,
    Verdict.UNKNOWN: FailureSide.UNKNOWN,
}


def outcome(committed: CheckpointCommittedV1, report: Report) -> list[EventData]:
    """`verified` with the checks that passed, or `corrupt` + `quarantined` with the findings.

    A corrupt checkpoint is tagged into quarantine at once so it is never offered again, and
    the same bad version is not retried (R7).
    """
    base = {
        "job_id": committed.job_id,
        "checkpoint_id": committed.checkpoint_id,
        "uri": committed.uri,
    }
    if report.ok:
        checks = (*report.checks, *(f"{f}={d}" for f, d in sorted(report.checksums.items())))
        return [
            CheckpointVerifiedV1(
                **base,
                checks=checks,
                exact_resume=report.exact_resume is not False,
                bytes_verified=report.bytes_read,
            )
        ]
    reason = f"{report.verdict.value}: {report.reasons[0] if report.reasons else 'no detail'}"
    return [
        CheckpointCorruptV1(
            **base,
            reason=reason,
            side=_SIDE[report.verdict],
            findings=tuple(report.reasons[:50]),
        ),
        CheckpointQuarantinedV1(**base, reason=f"integrity check failed: {reason}"),
    ]
