"""Copy decisions (a tier that replicates, R13): which valid checkpoints still lack their copy,
what a copy's verification concluded, how far replication lags. Pure.

A tier with ``replicate`` names where its copies go by a deployment setting (the
integrity-checker's ``replica_roots``: tier → root). Each valid checkpoint of a job on such a
tier is copied to the same key under that root, verified there against the checksums recorded
when the checkpoint was verified, and only then recorded ``valid`` (`CheckpointCopyChangedV1`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from ckpt_ha.contracts.checkpoint import CheckpointCopyChangedV1, CheckpointState, CopyState
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import Tier
from ckpt_ha.formats.report import Report
from ckpt_ha.integrity_checker.domain import scrub_findings

COMMIT_EVIDENCE = frozenset({"ckpt-ha.manifest.json", "ckpt-ha.commit.json", ".metadata"})
"""Files that make a folder a committed checkpoint (native manifest, ckpt-ha's commit sidecar,
DCP's metadata): written last on a replica, so a copy cut short never looks committed."""


def commit_evidence(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in COMMIT_EVIDENCE


def replica_root(tier: Tier, roots: Mapping[str, str]) -> str | None:
    """Where ``tier``'s copies go: its root in ``roots`` when the tier replicates (None: no
    copies, the tier does not replicate or no root is configured for it)."""
    if not tier.replicate:
        return None
    return roots.get(tier.name)


def needs_copy(record: CheckpointRecord, copy_uri: str) -> bool:
    """A valid checkpoint whose copy at ``copy_uri`` is not valid (never made, being made,
    found corrupt or missing)."""
    if record.state is not CheckpointState.VALID or not record.checksums:
        return False
    copy = record.copies.get(copy_uri)
    return copy is None or copy.state is not CopyState.VALID


def copy_key(record: CheckpointRecord, copy_uri: str, step: str) -> str:
    """The id key of a copy event: the checkpoint, the copy, the step (``copying`` /
    ``verified``) and the copy's last recorded event, so a repeated round publishes the same ids
    (deduplicated) and a new cycle after a loss new ones."""
    copy = record.copies.get(copy_uri)
    return f"copy|{record.checkpoint_id}|{copy_uri}|{step}|{copy.event_id if copy else ''}"


def copying(record: CheckpointRecord, copy_uri: str, tier: str) -> CheckpointCopyChangedV1:
    return CheckpointCopyChangedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        copy_uri=copy_uri,
        copy_state=CopyState.COPYING,
        reason=_why_copy(record, copy_uri),
        tier=tier,
    )


def _why_copy(record: CheckpointRecord, copy_uri: str) -> str:
    copy = record.copies.get(copy_uri)
    if copy is None:
        return "no copy yet"
    if copy.state is CopyState.COPYING:
        return "resuming a copy cut short"
    return f"copying again: the copy was {copy.state.value}" + (
        f" ({copy.reason})" if copy.reason else ""
    )


def copy_outcome(
    record: CheckpointRecord, copy_uri: str, tier: str, report: Report, bytes_copied: int
) -> CheckpointCopyChangedV1:
    """``valid`` when the copy matches every checksum recorded at verification, else
    ``corrupt`` with the first finding."""
    findings = scrub_findings(record.checksums, report)
    state = CopyState.CORRUPT if findings else CopyState.VALID
    reason = (
        f"verified: {len(record.checksums)} files match their recorded checksums"
        if not findings
        else f"copy verification failed: {findings[0]}"
    )
    return CheckpointCopyChangedV1(
        job_id=record.job_id,
        checkpoint_id=record.checkpoint_id,
        uri=record.uri,
        copy_uri=copy_uri,
        copy_state=state,
        reason=reason[:4000],
        tier=tier,
        bytes_copied=bytes_copied,
    )


def lag_seconds(waiting: Iterable[CheckpointRecord], now: datetime) -> float:
    """Replication lag: the age of the oldest valid checkpoint still lacking its copy (when it
    became valid, else when it was created); 0 when none lacks one."""
    oldest: datetime | None = None
    for record in waiting:
        since = next(
            (h.at for h in record.history if h.state is CheckpointState.VALID), record.created_at
        )
        oldest = since if oldest is None or since < oldest else oldest
    return 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
