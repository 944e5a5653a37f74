"""Resume aggregate: resume.* events (v1; resume.load_failed also v2), the restore path from
plan to verified continuation."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ckpt_ha.contracts.checkpoint import FailureSide
from ckpt_ha.contracts.envelope import EventData


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

    name: str
    expected: float | str | None
    observed: float | str | None
    tolerance: float = 0.0
    ok: bool


class _ResumeEvent(EventData):
    plan_id: str = Field(min_length=1, max_length=200)

    def subject_key(self) -> str:
        return self.plan_id


class ResumePlannedV1(_ResumeEvent):
    EVENT_TYPE: ClassVar[str] = "resume.planned"
    EVENT_VERSION: ClassVar[int] = 1

    failed_run_id: str
    attempt: int = Field(ge=1)
    checkpoint_id: str
    checkpoint_uri: str
    step: int = Field(ge=0)
    mode: ResumeMode
    compatibility: Compatibility
    recompute_steps: int = Field(default=0, ge=0)
    recompute_seconds: float = Field(default=0.0, ge=0)
    fallback_from: str | None = None
    """Checkpoint id that failed to load, when this plan is the fallback."""
    checkpoint_format: str | None = None
    reasons: tuple[str, ...] = ()
    """Why this mode and compatibility (the differences found, the rule that allowed them)."""
    pinned: tuple[str, ...] = ()
    """Checkpoint ids kept as fallback until the resumed job registers a new valid one (R15)."""
    expected_step: int | None = Field(default=None, ge=0)
    """The step the resumed job must report first (the checkpoint's step)."""


class ResumeLoadedV1(_ResumeEvent):
    EVENT_TYPE: ClassVar[str] = "resume.loaded"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    checkpoint_id: str
    step: int = Field(ge=0)
    attempt: int | None = Field(default=None, ge=1)
    data_position: int | None = Field(default=None, ge=0)
    rng_fingerprint: str | None = None
    load_seconds: float | None = Field(default=None, ge=0)


class ResumeLoadFailedV1(_ResumeEvent):
    EVENT_TYPE: ClassVar[str] = "resume.load_failed"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    checkpoint_id: str
    reason: str
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

    run_id: str
    checkpoint_id: str
    reason: str
    side: FailureSide = FailureSide.UNKNOWN
    blame: LoadBlame
    rank: int | None = Field(default=None, ge=0)
    """The process (rank) whose load failed first, in a multi-rank job."""


def load_failed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 load failure said only which side must act: an infrastructure-side one (storage
    gone) blames the attempt, anything else the checkpoint, as v1 consumers treated it."""
    side = data.get("side")
    blame = LoadBlame.ATTEMPT if side == FailureSide.INFRASTRUCTURE.value else LoadBlame.CHECKPOINT
    return {**data, "blame": blame.value}


class ResumeVerifiedV1(_ResumeEvent):
    EVENT_TYPE: ClassVar[str] = "resume.verified"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    checkpoint_id: str
    step: int = Field(ge=0)
    comparisons: tuple[Comparison, ...] = ()


class ResumeDivergedV1(_ResumeEvent):
    EVENT_TYPE: ClassVar[str] = "resume.diverged"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    checkpoint_id: str
    step: int = Field(ge=0)
    comparisons: tuple[Comparison, ...] = ()
    reason: str


class ResumeClosedV1(_ResumeEvent):
    """After a verified resume (R11): the failed attempt's leftovers cleaned, and what was not."""

    EVENT_TYPE: ClassVar[str] = "resume.closed"
    EVENT_VERSION: ClassVar[int] = 1

    cleaned: tuple[str, ...] = ()
    unreclaimable: tuple[str, ...] = ()


class ResumeEscalatedV1(_ResumeEvent):
    """Automatic retries stopped (R9); a human is paged with the runbook's next step."""

    EVENT_TYPE: ClassVar[str] = "resume.escalated"
    EVENT_VERSION: ClassVar[int] = 1

    reason: str
    next_step: str
    detail: str = ""


RESUME_EVENTS: tuple[type[EventData], ...] = (
    ResumePlannedV1,
    ResumeLoadedV1,
    ResumeLoadFailedV1,
    ResumeLoadFailedV2,
    ResumeVerifiedV1,
    ResumeDivergedV1,
    ResumeClosedV1,
    ResumeEscalatedV1,
)


UPCASTERS: tuple[tuple[str, int, Callable[[dict[str, Any]], dict[str, Any]]], ...] = (
    ("resume.load_failed", 1, load_failed_v1_to_v2),
)
"""(event type, from version, upcaster) for every resume event with more than one version."""
