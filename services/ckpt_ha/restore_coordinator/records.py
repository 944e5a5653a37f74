"""What the restore path remembers, as plain values, and their JSON in the coordinator's key
space: pure, shared by the coordinator's store (`ckpt_ha.restore_coordinator.store`), its
domain and its read API (`ckpt_ha.restore_coordinator.api`, the one face other code imports).
No I/O here; every Redis detail lives with the store. The R15 `Pin` is the pins' owner's
(`ckpt_ha.registry.pins`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict

from ckpt_ha.contracts.checkpoint import RuntimeEnvironment, Topology
from ckpt_ha.contracts.job import JobPolicy, JobStartedV1
from ckpt_ha.contracts.resume import ResumePlannedV2
from ckpt_ha.core.pins import Pin


@dataclass(frozen=True)
class Target:
    """What the restore lands on: the failed attempt's environment, topology and code, until
    the attempt that loads the plan says its own (`domain.replan`)."""

    environment: RuntimeEnvironment | None = None
    topology: Topology | None = None
    code_version: str | None = None


@dataclass(frozen=True)
class Point:
    """One progress report."""

    step: int
    at: datetime
    attempt: int = 1
    data_position: int | None = None
    rng_fingerprint: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """One failed attempt of a job, as the coordinator logged it (one entry per attempt)."""

    attempt: int
    at: datetime
    signature: str | None = None
    infrastructure: bool = False


@dataclass(frozen=True)
class History:
    """What the coordinator remembers of a job, newest last where ordered."""

    restarts: Sequence[datetime] = ()
    """When each automatic restore was planned."""
    failures: Sequence[Failure] = ()
    """The latest failures in attempt order (the current one included)."""
    storage_errors: Sequence[datetime] = ()
    """Infrastructure-side failures (job failures and load failures)."""
    fallbacks: int = 0
    """Load failures already answered with an older checkpoint in this chain."""


def planned_pins(data: ResumePlannedV2) -> list[Pin]:
    """R15: the pins a plan implies (its ``pinned``): the checkpoint it restores from and the
    previous valid one, until the resumed attempt registers a newer valid checkpoint."""
    return [
        Pin(
            checkpoint_id,
            "restored from" if checkpoint_id == data.checkpoint_id else "fallback",
            data.plan_id,
            data.step,
            data.attempt,
        )
        for checkpoint_id in data.pinned
    ]


class Started(BaseModel):
    """What an attempt's ``job.started`` declared."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    attempt: int
    at: AwareDatetime
    policy: JobPolicy = JobPolicy()
    environment: RuntimeEnvironment | None = None
    topology: Topology | None = None
    code_version: str | None = None
    plan_id: str | None = None

    @classmethod
    def of(cls, data: JobStartedV1, at: datetime) -> Started:
        return cls(
            run_id=data.run_id,
            attempt=data.attempt,
            at=at,
            policy=data.policy or JobPolicy(),
            environment=data.environment,
            topology=data.topology,
            code_version=data.code_version,
            plan_id=data.plan_id,
        )

    def target(self) -> Target:
        return Target(self.environment, self.topology, self.code_version)


def attempt_key(job_id: str, run_id: str, attempt: int) -> str:
    """One attempt of one run of a job, as a single string (`Watch.key`)."""
    return f"{job_id}|{run_id}|{attempt}"


class Watch(BaseModel):
    """The latest attempt of a job whose silence the restore-coordinator watches (one per job,
    `ckpt_ha.restore_coordinator.liveness`): its last sign of life (``job.started``,
    ``job.progress``, ``job.heartbeat``) and its deadline. An ended attempt is kept as a
    tombstone, so that its start handled after its end (the consumers run independently)
    does not watch it again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    run_id: str
    attempt: int
    started_at: AwareDatetime
    seen: AwareDatetime
    """The last sign of life (the event's time)."""
    deadline_s: float | None = None
    """Silence after which the attempt is lost; None: it promised no heartbeat (never lost)."""
    ended: bool = False
    """It failed or succeeded (or was declared lost): nothing more to watch."""
    plan_id: str | None = None
    last_step: int | None = None

    @property
    def key(self) -> str:
        return attempt_key(self.job_id, self.run_id, self.attempt)

    def unheard(self, before: Watch | None) -> list[str]:
        """The attempts whose note of being heard goes with this watch replacing ``before``:
        this one once it ended, ``before`` when it was another attempt (superseded)."""
        out = [self.key] if self.ended else []
        if before is not None and before.key != self.key:
            out.append(before.key)
        return out

    @property
    def due(self) -> datetime | None:
        """When the attempt is lost if nothing is heard (None: never)."""
        if self.ended or self.deadline_s is None:
            return None
        return self.seen + timedelta(seconds=self.deadline_s)


class PlanRecord(BaseModel):
    """A restore plan: what it restores, for which failed attempt, under which policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_id: str
    job_id: str
    failed_run_id: str
    failed_attempt: int
    attempt: int
    checkpoint_id: str
    step: int
    fallbacks: int = 0
    failed_at: AwareDatetime
    policy: JobPolicy = JobPolicy()

    @classmethod
    def of(
        cls,
        data: ResumePlannedV2,
        *,
        failed_at: datetime | None = None,
        fallbacks: int = 0,
        policy: JobPolicy | None = None,
    ) -> PlanRecord:
        """The plan as its ``resume.planned`` states it: the coordinator stores exactly this, and
        a rebuild from the stream restores it. The event's own ``failed_at``, ``fallbacks`` and
        ``policy`` win; the arguments stand in for an event of an older coordinator that did
        not carry them."""
        at = data.failed_at or failed_at
        if at is None:
            raise ValueError(f"plan {data.plan_id}: no failure time in the event or given")
        return cls(
            plan_id=data.plan_id,
            job_id=data.job_id,
            failed_run_id=data.failed_run_id,
            failed_attempt=data.attempt - 1,
            attempt=data.attempt,
            checkpoint_id=data.checkpoint_id,
            step=data.step,
            fallbacks=data.fallbacks if data.fallbacks is not None else fallbacks,
            failed_at=at,
            policy=data.policy or policy or JobPolicy(),
        )


class DecisionRecord(BaseModel):
    """The events decided for one failure, stored before they are published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    events: tuple[str, ...]
    """Envelope JSON, published in order (re-published as is after a crash: same ids)."""
    published: bool = False


# --- JSON in the key space ---

COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""Compact JSON, one encoder for every document written (``json.dumps`` with options builds
one per call)."""


def planned_location(decision: DecisionRecord | None, plan_id: str) -> str | None:
    """Where the stored ``resume.planned`` of ``plan_id`` restores from (its
    ``checkpoint_uri``: the primary or a verified copy); None: no such event in ``decision``.
    Read from the decision rather than kept in `PlanRecord`, whose stored form an older
    coordinator replica must still read during a rolling upgrade."""
    if decision is None:
        return None
    for raw in decision.events:
        doc = json.loads(raw)
        data = doc.get("data")
        if not str(doc.get("type", "")).startswith("ckpt-ha.resume.planned.v"):
            continue
        if isinstance(data, dict) and data.get("plan_id") == plan_id:
            uri = data.get("checkpoint_uri")
            return uri if isinstance(uri, str) else None
    return None


def point_json(p: Point) -> str:
    """``asdict(p)`` as JSON, built field by field: one per progress report on the hot path,
    where ``asdict`` (a deep copy) cost more than the JSON itself."""
    doc = {
        "step": p.step,
        "at": p.at.isoformat(),
        "attempt": p.attempt,
        "data_position": p.data_position,
        "rng_fingerprint": p.rng_fingerprint,
        "metrics": dict(p.metrics),
    }
    return COMPACT_JSON.encode(doc)


def point_of(raw: str | bytes) -> Point:
    doc = json.loads(raw)
    doc["at"] = datetime.fromisoformat(doc["at"])
    return Point(**doc)


def failure_json(f: Failure) -> str:
    return COMPACT_JSON.encode(
        {
            "attempt": f.attempt,
            "at": f.at.isoformat(),
            "signature": f.signature,
            "infrastructure": f.infrastructure,
        }
    )


def failure_of(raw: str | bytes) -> Failure:
    doc = json.loads(raw)
    doc["at"] = datetime.fromisoformat(doc["at"])
    return Failure(**doc)


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def unix(at: datetime) -> float:
    return at.timestamp()


def from_unix(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


ATTENTION_STATUSES = ("escalated", "lost", "diverged", "load_failed")
"""What may hold a job's attention record (`Attention`): a resume the coordinator stopped
(``escalated``, by reason), an attempt it declared lost, a resume that diverged, a restore
that failed to load."""


@dataclass(frozen=True)
class Attention:
    """A job's state that needs someone: set by the event that caused it, cleared only by an
    event that ends it (an operator's act, a new start, a verified resume, the run's end) of
    the same or a later time. The pages are built on these records (never on one replica's
    memory or on how long ago something happened)."""

    job_id: str
    status: str
    reason: str
    since: datetime


def attention_value(status: str, reason: str, at: datetime) -> str:
    """``<unix time>|<status>|<reason>`` (the time first: the store's script compares it)."""
    return f"{unix(at)!r}|{status}|{reason}"


def attention_of(job: str, raw: str | bytes) -> Attention:
    at, status, reason = text(raw).split("|", 2)
    return Attention(job_id=job, status=status, reason=reason, since=from_unix(float(at)))


FailureItem = tuple[str, int, Failure, str | None]
"""A failure to record (`RestoreState.failure_contexts`): job, attempt, the failure, and its
storage-error key when infrastructure-side (None: not one)."""

FailureContext = tuple[Started | None, Point | None, History, set[str], DecisionRecord | None]
"""What deciding a failure reads back as it records it (`RestoreState.failure_context`): the
attempt's start, its last progress, the job's history, its exclusions, and the decision already
taken for that failure."""


@dataclass(frozen=True)
class DecisionWrite:
    """One decision to store with what it implies (`RestoreState.record_decisions`): its plan,
    restart and pins, and the escalation of the job a plan after it settles (``settles``: the
    plan's time; None: nothing to settle)."""

    job: str
    attempt: int
    decision: DecisionRecord
    plan: PlanRecord | None = None
    pins: Sequence[Pin] = ()
    planned_at: datetime | None = None
    settles: datetime | None = None
