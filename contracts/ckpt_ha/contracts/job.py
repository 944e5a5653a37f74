"""Job aggregate: job.* events, emitted by scheduler adapters (job.started and job.failed also
v2; older versions are upcast)."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ckpt_ha.contracts.bounds import (
    Attempt,
    Count,
    ExitCode,
    FiniteFloat,
    Label,
    Metrics,
    Name,
    Rank,
    Seconds,
    Signal,
    Text,
)
from ckpt_ha.contracts.checkpoint import FailureSide, RuntimeEnvironment, Topology
from ckpt_ha.contracts.envelope import EventData

MAX_STALLED_RANKS = 64
"""The ranks a hang names at most (the first to stop; the rest are waiting for them)."""


class FailureCause(StrEnum):
    """Why an attempt ended (``job.failed`` v3; v2 knows all but ``hang``, v1 the first five
    only)."""

    NODE_EXIT = "node_exit"
    """The process was killed from outside (a signal nobody in the job sent)."""
    OOM = "oom"
    ERROR = "error"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"
    NODE_LOST = "node_lost"
    """The scheduler says the node the attempt ran on failed or stopped responding."""
    LOST = "lost"
    """Nobody reported the end: the attempt sent neither progress nor heartbeat within its
    deadline (declared by the restore-coordinator, not by the attempt)."""
    CANCELLED = "cancelled"
    """A user cancelled the job: never restored automatically."""
    HANG = "hang"
    """The attempt's processes were alive but its progress stopped for longer than its hang
    threshold (outside a save, an evaluation or its first steps): its supervisor stopped it."""


class FailureCauseV2(StrEnum):
    """The causes ``job.failed`` v2 can carry (v2 consumers refuse ``hang``)."""

    NODE_EXIT = "node_exit"
    OOM = "oom"
    ERROR = "error"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"
    NODE_LOST = "node_lost"
    LOST = "lost"
    CANCELLED = "cancelled"


class FailureCauseV1(StrEnum):
    """The causes ``job.failed`` v1 can carry (v1 consumers refuse any other)."""

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
    """An attempt of the job started, with its declared policy, runtime environment, topology
    and code version: what a restore's compatibility is judged against."""

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


class JobStartedV2(JobStartedV1):
    """v2 declares how the attempt shows it is alive: a heartbeat every ``heartbeat_s`` and
    silence for longer than ``deadline_s`` means lost (``job.failed`` cause ``lost``). A new
    version, not new fields on v1 (v1 refuses unknown fields); v1 events are upcast
    (`started_v1_to_v2`: both None, an attempt that promised no heartbeat is never declared
    lost)."""

    EVENT_VERSION: ClassVar[int] = 2

    heartbeat_s: Seconds | None = Field(default=None, gt=0)
    """How often the attempt's supervisor publishes ``job.heartbeat`` (None: it does not)."""
    deadline_s: Seconds | None = Field(default=None, gt=0)
    """Silence (no progress, no heartbeat) after which the attempt is lost. None: the default
    of its tier (``heartbeat_s`` set) or never (no heartbeats promised)."""


class JobHeartbeatV1(EventData):
    """The attempt's supervisor (runner or scheduler adapter) is alive and so is the attempt,
    whether or not training reports progress. Sent every ``job.started``'s ``heartbeat_s``."""

    EVENT_TYPE: ClassVar[str] = "job.heartbeat"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    sequence: Count = 0
    """Counts the attempt's heartbeats (each one is a distinct event)."""
    last_step: Count | None = None
    """The last step the attempt reported, if any (display only)."""


class JobProgressV1(EventData):
    """A training step the job reached (data position, RNG fingerprint, metrics): the
    trajectory the continuity check compares a resumed attempt against."""

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
    """An attempt of the job ended in failure, with its cause, side, last step and failure
    signature: the restore-coordinator plans its restore."""

    EVENT_TYPE: ClassVar[str] = "job.failed"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    cause: FailureCauseV1 = FailureCauseV1.UNKNOWN
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


class JobFailedV2(JobFailedV1):
    """v2 adds the causes a supervisor outside the process can tell (``node_lost``, ``lost``,
    ``cancelled``), the failing rank and who reported the failure. v1 events are upcast
    (`failed_v1_to_v2`)."""

    EVENT_VERSION: ClassVar[int] = 2

    cause: FailureCauseV2 = FailureCauseV2.UNKNOWN  # type: ignore[assignment]
    rank: Rank | None = None
    """The process (rank) that failed first, in a multi-rank job."""
    reported_by: Name | None = None
    """Who saw the end: ``runner``, a scheduler adapter (``slurm``), or ``restore-coordinator``
    for a lost attempt. None: an older reporter."""


class JobFailedV3(JobFailedV2):
    """v3 adds the cause ``hang`` (the attempt's processes lived on while its progress
    stopped; its supervisor stopped them) and, for it, the ranks that stopped first. v2 events
    are upcast (`failed_v2_to_v3`); a v2 consumer parks a v3 event, so a supervisor publishes
    v3 for a hang only."""

    EVENT_VERSION: ClassVar[int] = 3

    cause: FailureCause = FailureCause.UNKNOWN  # type: ignore[assignment]
    stalled_ranks: tuple[Rank, ...] = Field(default=(), max_length=MAX_STALLED_RANKS)
    """The ranks whose progress stopped first (cause ``hang``, ranks that report progress);
    empty otherwise. ``rank`` is the first of them."""
    hang_after_s: Seconds | None = Field(default=None, gt=0)
    """The silence, in seconds, that made it a hang (its threshold at the time); None for
    another cause."""


class JobSucceededV1(EventData):
    """The training command exited 0: nothing more to restore for this run."""

    EVENT_TYPE: ClassVar[str] = "job.succeeded"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: Label
    attempt: Attempt = 1
    last_step: Count | None = None


class _OperatorAct(EventData):
    """An operator's act on a job through ``ckpt-ha job ...``: who did it and why, recorded in
    the stream like every decision (the restore-coordinator and the runner rebuild from it)."""

    actor: Name = Field(min_length=1)
    reason: Text = ""


class JobHeldV1(_OperatorAct):
    """Automatic restores of the job are paused: its failures are still recorded, but the
    restore-coordinator plans none of them until ``job.unheld`` (then it plans the latest one,
    if nothing was decided about it yet)."""

    EVENT_TYPE: ClassVar[str] = "job.held"
    EVENT_VERSION: ClassVar[int] = 1


class JobUnheldV1(_OperatorAct):
    """Automatic restores of the job resume (see `JobHeldV1`)."""

    EVENT_TYPE: ClassVar[str] = "job.unheld"
    EVENT_VERSION: ClassVar[int] = 1


class JobRestoreRequestedV1(_OperatorAct):
    """A chosen rollback: restore the job from ``checkpoint_id`` (one of its own, valid) rather
    than from its newest valid checkpoint. The restore-coordinator answers with a
    ``resume.planned`` for it, or refuses (another job's, or not valid) with a
    ``resume.escalated``. Newer valid checkpoints stay valid: nothing is quarantined."""

    EVENT_TYPE: ClassVar[str] = "job.restore_requested"
    EVENT_VERSION: ClassVar[int] = 1

    checkpoint_id: Name = Field(min_length=1)


class JobStopRequestedV1(_OperatorAct):
    """Stop the job: its runner stops the running attempt and ends the run (no restore)."""

    EVENT_TYPE: ClassVar[str] = "job.stop_requested"
    EVENT_VERSION: ClassVar[int] = 1


JOB_EVENTS: tuple[type[EventData], ...] = (
    JobStartedV1,
    JobStartedV2,
    JobHeartbeatV1,
    JobProgressV1,
    JobFailedV1,
    JobFailedV2,
    JobFailedV3,
    JobSucceededV1,
    JobHeldV1,
    JobUnheldV1,
    JobRestoreRequestedV1,
    JobStopRequestedV1,
)


def started_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 start promised no heartbeat: never declared lost."""
    return {**data, "heartbeat_s": None, "deadline_s": None}


def failed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 failure named no rank and no reporter."""
    return {**data, "rank": None, "reported_by": None}


def failed_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """A v2 failure is no hang: no stalled ranks, no threshold."""
    return {**data, "stalled_ranks": (), "hang_after_s": None}


JOB_UPCASTERS: tuple[tuple[str, int, Callable[[dict[str, Any]], dict[str, Any]]], ...] = (
    ("job.started", 1, started_v1_to_v2),
    ("job.failed", 1, failed_v1_to_v2),
    ("job.failed", 2, failed_v2_to_v3),
)
"""(event type, from version, upcaster) for every job event with more than one version."""
