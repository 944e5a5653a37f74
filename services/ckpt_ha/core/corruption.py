"""How any service says "this checkpoint is corrupt": one `corrupt` + `quarantined` pair. Pure.

The integrity-checker (a failed verification or scrub) and the writer-watcher (shards gone from
a checkpoint that was already valid) report corruption the same way: the `corrupt` fact with its
side and findings, then the checkpoint tagged into quarantine at once, so it is never offered
for restore again and the same bad version is not retried (R7).
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt_ha.contracts.checkpoint import CheckpointCorruptV1, CheckpointQuarantinedV1, FailureSide

MAX_FINDINGS = 50


def condemn(
    *,
    job_id: str,
    checkpoint_id: str,
    uri: str,
    reason: str,
    side: FailureSide,
    findings: Sequence[str] = (),
    why_quarantined: str,
) -> tuple[CheckpointCorruptV1, CheckpointQuarantinedV1]:
    """The two events, in the order they must be published. ``quarantine_uri`` is left unset:
    whoever moves the bytes aside fills it in (`ckpt_ha.storage.quarantine_move.isolate`)."""
    base = {"job_id": job_id, "checkpoint_id": checkpoint_id, "uri": uri}
    return (
        CheckpointCorruptV1(
            **base, reason=reason, side=side, findings=tuple(findings[:MAX_FINDINGS])
        ),
        CheckpointQuarantinedV1(**base, reason=why_quarantined),
    )
