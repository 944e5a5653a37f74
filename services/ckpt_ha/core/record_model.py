"""The checkpoint registry's records: what it keeps of each checkpoint (`CheckpointRecord`,
with its history, pins, expiry and tombstone) and of each job (its tier choice, its ownership
log). Pure data; `ckpt_ha.core.records` projects the event stream onto them and is where
callers import them from.
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from ckpt_ha.contracts.checkpoint import CheckpointFormat, CheckpointIdentity, CheckpointState
from ckpt_ha.core.copies import CopyRecord


class HistoryEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state: CheckpointState
    at: AwareDatetime
    event_id: str
    event_type: str
    actor: str
    reason: str | None = None


class PinRecord(BaseModel):
    """Someone (``by``) still needs the checkpoint; retention keeps it while the pin stands."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str
    reason: str
    actor: str
    at: AwareDatetime
    event_id: str


class Expiry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str
    policy: str
    tier: str | None = None
    grace_until: AwareDatetime | None = None
    actor: str
    at: AwareDatetime


class Tombstone(BaseModel):
    """What stays of a deleted checkpoint (R6): with the record's id, URI and checksums, why,
    under which policy, by whom and when its bytes were removed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str
    policy: str | None = None
    tier: str | None = None
    actor: str
    at: AwareDatetime
    event_id: str
    objects_deleted: int | None = None
    copies: tuple[str, ...] = ()
    """The copies on replicas the deletion removes as well (each then recorded ``deleted`` in
    the record's ``copies`` by the integrity-checker)."""


class TierRecord(BaseModel):
    """A recorded, explicit tier choice for a job (R13)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    tier: str
    actor: str
    reason: str
    at: AwareDatetime
    event_id: str


class CheckpointRecord(BaseModel):
    """What the registry knows of one checkpoint. ``uri`` is display only; identity is the id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_id: str
    job_id: str
    run_id: str | None = None
    step: int | None = None
    uri: str
    format: CheckpointFormat = CheckpointFormat.UNKNOWN
    state: CheckpointState
    identity: CheckpointIdentity | None = None
    shard_count: int | None = None
    total_bytes: int | None = None
    exact_resume: bool | None = None
    quarantine_uri: str | None = None
    """Where the bytes were moved when quarantined (None: tagged in place, or released)."""
    checksums: dict[str, str] = Field(default_factory=dict)
    """File → ``algorithm:hex`` as verified (from `CheckpointVerifiedV1.checks`); what a scrub
    compares the bytes on storage against."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Evaluation metrics the writer declared at commit (keep-best retention ranks them)."""
    pins: tuple[PinRecord, ...] = ()
    expiry: Expiry | None = None
    tombstone: Tombstone | None = None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    history: tuple[HistoryEntry, ...] = ()
    traceparent: str | None = None
    """W3C trace context of the checkpoint's trace (from its first event that carried one):
    what a later transition (scrub, restore, retention), after any restart, continues and links
    back to."""
    tracestate: str | None = None
    copies: dict[str, CopyRecord] = Field(default_factory=dict)
    """Copies on replicas (copy URI → its state), when the job's tier replicates
    (`ckpt_ha.core.copies`)."""
    fenced_by: int | None = None
    """Set when the commit was fenced (state ``fenced``): the attempt of its run that was
    already planned when the commit was handled (R17)."""


class OwnershipChange(BaseModel):
    """One entry of a job's ownership log (R5): who moved it, when, from where, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    from_project: str | None
    to_project: str
    actor: str
    at: AwareDatetime
    reason: str
    event_id: str
