"""Job aggregate: job.* events (v1), emitted by scheduler adapters."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ckpt_ha.contracts.bounds import (
    Attempt,
    Count,
    ExitCode,
    FiniteFloat,
    Label,
    Metrics,
    Name,
    Signal,
    Text,
)
from ckpt_ha.contracts.checkpoint import FailureSide, RuntimeEnvironment, Topology
from ckpt_ha.contracts.envelope import EventData


class FailureCause(StrEnum):
    NODE_EXIT = "node_exit"
    OOM = "oom"
    ERROR = "error"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CompatibilityRule(_Frozen):
    """A declared compatibility (R14): restoring a checkpoint written with ``field`` =
    ``written`` onto a target with ``field`` = ``target`` is a resume, not `unknown`.

    ``field``: ``framework_version``, ``python_version``, ``image``, ``code_version``,
    ``topology`` (values as ``world_size/tp/pp``) or ``libraries.<name>``; ``*`` matches any value.
    """

    field: Label = Field(min_length=1)
    written: Label = "*"
    target: Label = "*"


class Tolerance(_Frozen):
    """How far a resumed run's metric may differ from the pre-failure trajectory at the same
    step (R10): ``|observed - expected| <= abs + rel * |expected|``. Declared before the run."""

    metric: Name = Field(min_length=1)
    abs: FiniteFloat = Field(default=0.0, ge=0)
    rel: FiniteFloat = Field(default=0.0, ge=0)


class JobPolicy(_Frozen):
    """What a job declared before it ran: stop conditions (R9), compatibility rules (R14),
    continuity tolerances (R10). Defaults are the cautious ones."""

    tier: Name | None = None
    max_restarts: Count = 3
    """Automatic restores allowed within ``restart_window_s`` before escalating (restart loop)."""
    restart_window_s: FiniteFloat = Field(default=3600.0, gt=0)
    max_same_failure: Count = Field(default=3, ge=1)
    """The same failure signature this many times in a row escalates."""
    max_fallbacks: Count = 2
    """Older checkpoints to try after a load failure before escalating."""
    max_storage_errors: Count = Field(default=3, ge=1)
    """Storage-side failures (infrastructure) within the window before escalating."""
    allow_weights_only: bool = False
    """When compatibility is `unknown`: plan a clearly labelled weights-only initialisation
    instead of escalating."""
    compatible: tuple[CompatibilityRule, ...] = ()
    tolerances: tuple[Tolerance, ...] = ()
    """Metrics compared after a resume; data position and RNG fingerprint must match exactly."""
    continuity_steps: Count = Field(default=1, ge=1)
    """How many progress reports after the restored step are compared before the verdict."""


class JobStartedV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.started"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    tier: Name | None = None
    restored_from: Name | None = None
    """Checkpoint id this attempt was started from, if any."""
    plan_id: Name | None = None
    """The resume plan this attempt carries out, if any."""
    policy: JobPolicy | None = None
    """Declared before the run; the coordinator uses the latest attempt's."""
    environment: RuntimeEnvironment | None = None
    """What this attempt runs on: the restore target that compatibility is checked against."""
    topology: Topology | None = None
    code_version: Label | None = None
    command: tuple[Text, ...] = ()


class JobProgressV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.progress"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    step: Count
    data_position: Count | None = None
    rng_fingerprint: Label | None = None
    metrics: Metrics = Field(default_factory=dict)
    plan_id: Name | None = None
    """Set by a resumed attempt: the plan its continuity is checked for."""
    dropped_reports: Count = 0
    """How many earlier progress reports of the reporting process were never published (its
    queue was full while the bus was slow or down, or the broker refused them): a gap in the
    reported steps is then expected, not a sign of a stalled job. A running total."""


class JobFailedV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.failed"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    cause: FailureCause = FailureCause.UNKNOWN
    exit_code: ExitCode | None = None
    signal: Signal | None = None
    last_step: Count | None = None
    detail: Text = ""
    signature: Label | None = None
    """A stable fingerprint of the failure (cause, exit code, last error line): the same one
    repeating is a stop condition (R9)."""
    side: FailureSide = FailureSide.UNKNOWN
    plan_id: Name | None = None
    """The plan this attempt was carrying out, when it failed after a restore."""


class JobSucceededV1(EventData):
    """The training command exited 0: nothing more to restore for this run."""

    EVENT_TYPE: ClassVar[str] = "job.succeeded"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    last_step: Count | None = None


JOB_EVENTS: tuple[type[EventData], ...] = (
    JobStartedV1,
    JobProgressV1,
    JobFailedV1,
    JobSucceededV1,
)
