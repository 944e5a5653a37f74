"""Resume aggregate: resume.* events (v1; resume.load_failed also v2), the restore path from
plan to verified continuation."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from ckpt_ha.contracts.bounds import (
    Attempt,
    Count,
    FiniteFloat,
    Label,
    Name,
    Rank,
    Seconds,
    Text,
    Uri,
    WorldSize,
)
from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.envelope import EventData
from ckpt_ha.contracts.job import JobPolicy


class ResumeMode(StrEnum):
    EXACT = "exact_resume"
    COMPATIBLE = "compatible_resume"
    WEIGHTS_ONLY = "weights_only_init"


class Compatibility(StrEnum):
    """R14: a restore onto an untested combination is `unknown`, never resumed automatically."""

    IDENTICAL = "identical"
    DECLARED_COMPATIBLE = "declared_compatible"
    UNKNOWN = "unknown"


class Comparison(BaseModel):
    """One continuity check (R10) under a tolerance declared before the run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Label
    expected: FiniteFloat | Label | None
    observed: FiniteFloat | Label | None
    tolerance: FiniteFloat = 0.0
    ok: bool


class _ResumeEvent(EventData):
    plan_id: Name = Field(min_length=1)

    def subject_key(self) -> str:
        return self.plan_id


class ResumePlannedV1(_ResumeEvent):
    """A restore plan after a failure: the checkpoint, the mode, the recompute range and the
    attempt that will run it."""

    EVENT_TYPE: ClassVar[str] = "resume.planned"
    EVENT_VERSION: ClassVar[int] = 1

    failed_run_id: Label
    attempt: Attempt
    checkpoint_id: Name
    checkpoint_uri: Uri
    step: Count
    mode: ResumeMode
    compatibility: Compatibility
    recompute_steps: Count = 0
    recompute_seconds: Seconds = 0.0
    fallback_from: Name | None = None
    """Checkpoint id that failed to load, when this plan is the fallback."""
    checkpoint_format: Label | None = None
    reasons: tuple[Text, ...] = ()
    """Why this mode and compatibility (the differences found, the rule that allowed them)."""
    pinned: tuple[Name, ...] = ()
    """Checkpoint ids kept as fallback until the resumed job registers a new valid one (R15)."""
    expected_step: Count | None = None
    """The step the resumed job must report first (the checkpoint's step)."""


class ResumePlannedV2(ResumePlannedV1):
    """v2 carries everything the coordinator remembers of the plan (when the failure happened,
    how many fallbacks the chain has taken, the policy it was decided under), so a registry
    rebuilt from the stream restores it exactly. A new version, not new fields on v1: v1
    refuses unknown fields, so a v1 consumer would dead-letter it as malformed; it parks a v2
    instead until it is upgraded. v1 events are upcast (`planned_v1_to_v2`: all three None)."""

    EVENT_VERSION: ClassVar[int] = 2

    failed_at: AwareDatetime | None = None
    """When the failure this plan answers happened (for a fallback: the failure that started
    the chain). The restart-loop window counts plans from it. None: an older coordinator."""
    fallbacks: Count | None = None
    """Load failures answered with an older checkpoint in this chain, this plan included (0: a
    plan after a job failure). None: an older coordinator."""
    policy: JobPolicy | None = None
    """The policy the plan was decided under (the resumed attempt's continuity is checked
    against its tolerances). With ``failed_at`` and ``fallbacks``, the plan carries everything
    the coordinator remembers of it, so a registry rebuilt from the stream restores it exactly.
    None: an older coordinator."""


class ResumeLoadedV1(_ResumeEvent):
    """The resumed attempt loaded the plan's checkpoint, every shard checked."""

    EVENT_TYPE: ClassVar[str] = "resume.loaded"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    checkpoint_id: Name
    step: Count
    attempt: Attempt | None = None
    data_position: Count | None = None
    rng_fingerprint: Label | None = None
    load_seconds: Seconds | None = None
    world_size: WorldSize | None = None
    """How many processes loaded it (None: not reported)."""
    written_world_size: WorldSize | None = None
    """How many processes wrote it, when that differs from ``world_size``: the load resharded
    it (DCP), so the evidence says so instead of passing for an exact restore."""


class ResumeLoadFailedV1(_ResumeEvent):
    """The resumed attempt could not load the plan's checkpoint: the coordinator falls back."""

    EVENT_TYPE: ClassVar[str] = "resume.load_failed"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    checkpoint_id: Name
    reason: Text
    side: FailureSide = FailureSide.UNKNOWN


class LoadBlame(StrEnum):
    """What a failed load is evidence against (R7): only the checkpoint's own bytes failing their
    checks condemn the checkpoint."""

    CHECKPOINT = "checkpoint"
    """Its bytes failed their checks (size, checksum, structure): quarantine it, try the one
    before."""
    ATTEMPT = "attempt"
    """The loader does not support the format, a dependency is missing, the environment or the
    storage failed: the checkpoint stays valid; this attempt could not use it."""


class ResumeLoadFailedV2(_ResumeEvent):
    """v2 says what the failure is evidence against (``blame``): a loader that cannot read a
    format is not evidence that the checkpoint is bad. v1 events are upcast
    (`load_failed_v1_to_v2`)."""

    EVENT_TYPE: ClassVar[str] = "resume.load_failed"
    EVENT_VERSION: ClassVar[int] = 2

    run_id: Label
    checkpoint_id: Name
    reason: Text
    side: FailureSide = FailureSide.UNKNOWN
    blame: LoadBlame
    rank: Rank | None = None
    """The process (rank) whose load failed first, in a multi-rank job."""


def load_failed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 load failure said only which side must act: an infrastructure-side one (storage
    gone) blames the attempt, anything else the checkpoint, as v1 consumers treated it."""
    side = data.get("side")
    blame = LoadBlame.ATTEMPT if side == FailureSide.INFRASTRUCTURE.value else LoadBlame.CHECKPOINT
    return {**data, "blame": blame.value}


class ResumeVerifiedV1(_ResumeEvent):
    """The resumed attempt continued within the declared tolerances (R10)."""

    EVENT_TYPE: ClassVar[str] = "resume.verified"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    checkpoint_id: Name
    step: Count
    comparisons: tuple[Comparison, ...] = ()


class ResumeDivergedV1(_ResumeEvent):
    """The resumed attempt left the recorded trajectory beyond the declared tolerances (R10)."""

    EVENT_TYPE: ClassVar[str] = "resume.diverged"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    checkpoint_id: Name
    step: Count
    comparisons: tuple[Comparison, ...] = ()
    reason: Text


class ResumeClosedV1(_ResumeEvent):
    """After a verified resume (R11): the failed attempt's leftovers cleaned, and what was not."""

    EVENT_TYPE: ClassVar[str] = "resume.closed"
    EVENT_VERSION: ClassVar[int] = 1

    cleaned: tuple[Text, ...] = ()
    unreclaimable: tuple[Text, ...] = ()


class ResumeEscalatedV1(_ResumeEvent):
    """Automatic retries stopped (R9); a human is paged with the runbook's next step."""

    EVENT_TYPE: ClassVar[str] = "resume.escalated"
    EVENT_VERSION: ClassVar[int] = 1

    reason: Text
    next_step: Text
    detail: Text = ""


class ResumeEscalatedV2(ResumeEscalatedV1):
    """v2 names the failed attempt it decides (see `ResumePlannedV2` for why a new version). v1
    events are upcast (`escalated_v1_to_v2`: no attempt)."""

    EVENT_VERSION: ClassVar[int] = 2

    attempt: Attempt | None = None
    """The failed attempt this escalation decides (automatic restores stop there). None: an
    escalation that is not the decision about a failure (leftovers a verified resume could not
    reclaim), or an older coordinator."""


RESUME_EVENTS: tuple[type[EventData], ...] = (
    ResumePlannedV1,
    ResumePlannedV2,
    ResumeLoadedV1,
    ResumeLoadFailedV1,
    ResumeLoadFailedV2,
    ResumeVerifiedV1,
    ResumeDivergedV1,
    ResumeClosedV1,
    ResumeEscalatedV1,
    ResumeEscalatedV2,
)


def planned_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 plan did not say when its failure happened, its fallbacks or its policy: None (the
    rebuild recovers them from the coordinator's state as far as it can)."""
    return {**data, "failed_at": None, "fallbacks": None, "policy": None}


def escalated_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 escalation did not name the attempt it decides: None."""
    return {**data, "attempt": None}


UPCASTERS: tuple[tuple[str, int, Callable[[dict[str, Any]], dict[str, Any]]], ...] = (
    ("resume.load_failed", 1, load_failed_v1_to_v2),
    ("resume.planned", 1, planned_v1_to_v2),
    ("resume.escalated", 1, escalated_v1_to_v2),
)
"""(event type, from version, upcaster) for every resume event with more than one version."""
