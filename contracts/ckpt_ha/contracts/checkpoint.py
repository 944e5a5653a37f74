"""Checkpoint aggregate: lifecycle states, identity (R4) and the checkpoint.* events (v1)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from ckpt_ha.contracts.bounds import (
    Attempt,
    Count,
    Label,
    Libraries,
    Metrics,
    Name,
    Text,
    Uri,
    WorldSize,
)
from ckpt_ha.contracts.envelope import Envelope, EventData


class CheckpointState(StrEnum):
    """The one explicit lifecycle state of a checkpoint (R1)."""

    WRITING = "writing"
    PENDING_VERIFICATION = "pending_verification"
    VALID = "valid"
    CORRUPT = "corrupt"
    QUARANTINED = "quarantined"
    WRITE_FAILED = "write_failed"
    EXPIRED = "expired"
    DELETED = "deleted"
    FENCED = "fenced"
    """Committed by an attempt older than one already planned for its run (a zombie writer
    behind a partition): held, never verified, never valid; retention may expire it. Added after
    v1 of `CheckpointRegisteredV1`, whose ``state`` uses this enum: that event is published for
    valid records only, so no v1 consumer ever receives the new value."""


class CheckpointFormat(StrEnum):
    NATIVE = "native"
    TORCH_DCP = "torch_dcp"
    SAFETENSORS = "safetensors"
    HF_TRAINER = "hf_trainer"
    UNKNOWN = "unknown"


class FailureSide(StrEnum):
    """Who has to act on a failure (R2): the training job, or the platform under it."""

    JOB = "job"
    INFRASTRUCTURE = "infrastructure"
    UNKNOWN = "unknown"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Topology(_Frozen):
    """Parallel layout the checkpoint was written with; a restore onto another is not exact."""

    world_size: WorldSize
    tensor_parallel: WorldSize = 1
    pipeline_parallel: WorldSize = 1
    data_parallel: WorldSize | None = None


class RuntimeEnvironment(_Frozen):
    framework: Label | None = None
    framework_version: Label | None = None
    python_version: Label | None = None
    image: Label | None = None
    libraries: Libraries = Field(default_factory=dict)


class CheckpointIdentity(_Frozen):
    """What a checkpoint is bound to (R4). The storage path is display only, never identity."""

    job_id: Label
    run_id: Label
    attempt: Attempt = 1
    model_version: Label | None = None
    code_version: Label | None = None
    data_snapshot: Label | None = None
    config_hash: Label | None = None
    environment: RuntimeEnvironment | None = None
    topology: Topology | None = None
    created_at: AwareDatetime | None = None
    project: str | None = Field(default=None, min_length=1, max_length=200)
    """The owning project (R5): checkpoints belong to projects, never to a person."""


class _CheckpointEvent(EventData):
    checkpoint_id: Name = Field(min_length=1)
    uri: Uri

    def subject_key(self) -> str:
        return self.checkpoint_id


class CheckpointWritingV1(_CheckpointEvent):
    """A checkpoint folder appeared; it is being written and is not yet evidence of anything."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.writing"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    step: Count | None = None
    format: CheckpointFormat = CheckpointFormat.UNKNOWN


class CheckpointCommittedV1(_CheckpointEvent):
    """The format's commit evidence is complete on storage; integrity is not yet checked."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.committed"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    step: Count
    format: CheckpointFormat
    identity: CheckpointIdentity | None = None
    shard_count: Count = 0
    total_bytes: Count = 0
    metrics: Metrics = Field(default_factory=dict)
    """Evaluation metrics at this step (e.g. ``val_loss``): what a tier's keep-best rule ranks."""


class CheckpointWriteFailedV1(_CheckpointEvent):
    """The write stalled or lost shards: never a restore candidate."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.write_failed"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    side: FailureSide = FailureSide.UNKNOWN


class CheckpointVerifiedV1(_CheckpointEvent):
    """Integrity evidence: every check listed passed."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.verified"
    EVENT_VERSION: ClassVar[int] = 1

    checks: tuple[Text, ...] = ()
    exact_resume: bool = True
    """False when only weights are present (no optimizer/scheduler state)."""
    bytes_verified: Count = 0


class CheckpointCorruptV1(_CheckpointEvent):
    """Integrity check failed, with its findings: never a restore candidate."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.corrupt"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    side: FailureSide = FailureSide.UNKNOWN
    findings: tuple[Text, ...] = ()


class CheckpointRegisteredV1(_CheckpointEvent):
    """The registry now offers this checkpoint as valid for restore."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.registered"
    EVENT_VERSION: ClassVar[int] = 1

    step: Count
    state: CheckpointState = CheckpointState.VALID
    identity: CheckpointIdentity | None = None
    """What the checkpoint is bound to (R4), as the registry holds it."""
    project: Name | None = None
    """The owning project (R5) at registration time."""
    tier: Name | None = None
    """The job's protection tier (R13) at registration time."""


class CheckpointQuarantinedV1(_CheckpointEvent):
    """Isolated after a failed check or load, or by hand (``actor`` set): its bytes are moved
    to ``quarantine/`` and it is never offered for restore until released."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.quarantined"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    quarantine_uri: Uri | None = None
    actor: Name | None = None
    """Who quarantined it by hand (``ckpt-ha quarantine``); None when a service did."""


class CheckpointReleasedV1(_CheckpointEvent):
    """A human checked a quarantined checkpoint and released it: it is verified again, and
    becomes valid only if the integrity checks pass this time."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.released"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text = Field(min_length=1)
    actor: Name = Field(min_length=1)
    quarantine_uri: Uri | None = None
    """Where the bytes lie in quarantine, if they were moved there."""


class OwnershipTransferredV1(EventData):
    """A job's checkpoints move from one project to another (R5). Recorded, never widening."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.ownership_transferred"
    EVENT_VERSION: ClassVar[int] = 1

    from_project: Name | None = None
    """The owner the actor saw; the transfer is refused if the job has another owner now."""
    to_project: str = Field(min_length=1, max_length=200)
    reason: Text = Field(min_length=1)
    actor: Name = Field(min_length=1)


class CheckpointConflictV1(_CheckpointEvent):
    """Something claimed a transition or identity the registry refuses; needs a human look."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.conflict"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    existing_checkpoint_id: Name | None = None


class CheckpointFencedV1(_CheckpointEvent):
    """A commit refused because a newer attempt of its run was already planned (fencing, R17).

    The epoch of an attempt is its attempt number: ``resume.planned`` fixes the next one, and a
    commit's identity names the attempt that wrote it. Once attempt ``fenced_by`` of ``run_id``
    is planned, a commit whose identity names that run and an attempt below it is held as
    ``fenced``: never verified, never offered for restore, its bytes kept until retention
    expires and deletes it with a tombstone. Published by the registrar, once per checkpoint."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.fenced"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt
    """The attempt the commit's identity names (the stale writer)."""
    fenced_by: Attempt
    """The attempt of the run planned before this commit was handled."""
    step: Count | None = None
    reason: Text


class CheckpointExpiredV1(_CheckpointEvent):
    """Retention decided this checkpoint is no longer kept: no longer a restore candidate, its
    bytes are deleted after ``grace_until`` unless something protects it by then."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.expired"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    policy: Label
    grace_until: AwareDatetime | None = None
    tier: Name | None = None
    """The protection tier (R13) whose retention expired it."""
    actor: Name | None = None


class CheckpointDeletedV1(_CheckpointEvent):
    """Bytes are gone; the tombstone fields stay queryable forever (R6)."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.deleted"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    actor: Name
    policy: Label | None = None
    tier: Name | None = None
    """The protection tier (R13) whose retention deleted it."""
    objects_deleted: Count | None = None
    """How many storage objects were removed (0: they were already gone)."""


class CheckpointPinnedV1(_CheckpointEvent):
    """Someone still needs this checkpoint (an evaluation, a candidate model): retention keeps it
    while the pin stands (R6). Refused for a deleted or unknown checkpoint."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.pinned"
    EVENT_VERSION: ClassVar[int] = 1

    by: str = Field(min_length=1, max_length=200)
    """Who holds the pin, e.g. ``eval:mmlu`` or ``model:candidate-3``; one pin per holder."""
    reason: Text = Field(min_length=1)
    actor: Name = Field(min_length=1)


class CheckpointUnpinnedV1(_CheckpointEvent):
    """A holder released its pin; retention may expire the checkpoint again."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.unpinned"
    EVENT_VERSION: ClassVar[int] = 1

    by: str = Field(min_length=1, max_length=200)
    reason: Text = Field(min_length=1)
    actor: Name = Field(min_length=1)


class CopyState(StrEnum):
    """The state of one copy of a checkpoint on a replica (a tier that replicates): its own,
    beside the checkpoint's lifecycle state, which is the primary's."""

    COPYING = "copying"
    """Being copied: never restored from, whatever is on the replica already."""
    VALID = "valid"
    """Copied and verified against the checksums recorded when the checkpoint was verified."""
    CORRUPT = "corrupt"
    """Verified against those checksums and found different: copied again from a good copy."""
    MISSING = "missing"
    """Gone from where it was (a scrub found it so): copied again from a good copy."""
    DELETED = "deleted"
    """Removed on purpose (retention, a deletion): the tombstone names it."""


class CheckpointCopyChangedV1(_CheckpointEvent):
    """A copy of the checkpoint on a replica changed state (copying, valid, corrupt, missing,
    deleted). The copy is the same checkpoint (same id) at ``copy_uri``; ``uri`` stays the
    primary's. The lifecycle state does not move: it is the primary's, and a restore uses a
    valid copy when the primary is gone (`docs/SERVICES.md`, copies). Published by the
    integrity-checker, which owns copies."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.copy_changed"
    EVENT_VERSION: ClassVar[int] = 1

    copy_uri: Uri
    copy_state: CopyState
    reason: Text | None = None
    tier: Name | None = None
    """The protection tier (R13) whose replication asked for this copy."""
    bytes_copied: Count = 0
    """Bytes written to the replica for this change (0: none, e.g. a resumed copy found them
    there already, or a state found by a scrub)."""
    actor: Name | None = None


class TierChosenV1(EventData):
    """An explicit, recorded choice of a job's protection tier (R13). Without one a job gets the
    tier its own ``job.started`` declared, else the cheapest: never an expensive one by accident."""

    EVENT_TYPE: ClassVar[str] = "checkpoint.tier_chosen"
    EVENT_VERSION: ClassVar[int] = 1

    tier: str = Field(min_length=1, max_length=64)
    reason: Text = Field(min_length=1)
    actor: Name = Field(min_length=1)


CHECKPOINT_EVENTS: tuple[type[EventData], ...] = (
    CheckpointWritingV1,
    CheckpointCommittedV1,
    CheckpointWriteFailedV1,
    CheckpointVerifiedV1,
    CheckpointCorruptV1,
    CheckpointRegisteredV1,
    CheckpointQuarantinedV1,
    CheckpointReleasedV1,
    CheckpointConflictV1,
    CheckpointFencedV1,
    CheckpointExpiredV1,
    CheckpointDeletedV1,
    OwnershipTransferredV1,
    CheckpointPinnedV1,
    CheckpointUnpinnedV1,
    TierChosenV1,
    CheckpointCopyChangedV1,
)


CheckpointEvent = (
    Envelope[CheckpointWritingV1]
    | Envelope[CheckpointCommittedV1]
    | Envelope[CheckpointWriteFailedV1]
    | Envelope[CheckpointVerifiedV1]
    | Envelope[CheckpointCorruptV1]
    | Envelope[CheckpointRegisteredV1]
    | Envelope[CheckpointQuarantinedV1]
    | Envelope[CheckpointReleasedV1]
    | Envelope[CheckpointConflictV1]
    | Envelope[CheckpointFencedV1]
    | Envelope[CheckpointExpiredV1]
    | Envelope[CheckpointDeletedV1]
    | Envelope[OwnershipTransferredV1]
    | Envelope[CheckpointPinnedV1]
    | Envelope[CheckpointUnpinnedV1]
    | Envelope[TierChosenV1]
    | Envelope[CheckpointCopyChangedV1]
)
"""Any checkpoint event, as a handler that projects them all receives it."""
