"""Job aggregate: job.* events (v1), emitted by scheduler adapters."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from contracts.envelope import EventData


class FailureCause(StrEnum):
    NODE_EXIT = "node_exit"
    OOM = "oom"
    ERROR = "error"
    PREEMPTED = "preempted"
    UNKNOWN = "unknown"


class JobStartedV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.started"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    attempt: int = Field(default=1, ge=1)
    tier: str | None = None
    restored_from: str | None = None
    """Checkpoint id this attempt was started from, if any."""


class JobProgressV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.progress"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    attempt: int = Field(default=1, ge=1)
    step: int = Field(ge=0)
    data_position: int | None = Field(default=None, ge=0)
    rng_fingerprint: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class JobFailedV1(EventData):
    EVENT_TYPE: ClassVar[str] = "job.failed"
    EVENT_VERSION: ClassVar[int] = 1

    run_id: str
    attempt: int = Field(default=1, ge=1)
    cause: FailureCause = FailureCause.UNKNOWN
    exit_code: int | None = None
    signal: int | None = None
    last_step: int | None = Field(default=None, ge=0)
    detail: str = ""


JOB_EVENTS: tuple[type[EventData], ...] = (JobStartedV1, JobProgressV1, JobFailedV1)
