"""R7, R15: the checkpoint to restore, the fallback to keep pinned, what a failure waits for
(a pending verification, an unregistered commit) and the fence of a stale writer."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from ckpt_ha.contracts.checkpoint import (
    CheckpointIdentity,
    CheckpointState,
)
from ckpt_ha.restore_coordinator.domain.exclusions import Exclusions
from ckpt_ha.restore_coordinator.records import (
    PlanRecord,
    Started,
)

PLAN_NAMESPACE = uuid.UUID("3a4f7c52-2f3e-4b8e-9d61-0c6a7b1e5d24")


@dataclass(frozen=True)
class Candidate:
    """What the coordinator needs of a registry record."""

    checkpoint_id: str
    step: int | None
    uri: str
    state: CheckpointState
    identity: CheckpointIdentity | None = None
    created_at: datetime | None = None
    exact_resume: bool | None = None
    format: str | None = None
    run_id: str | None = None
    traceparent: str | None = None
    """The checkpoint's trace context (from the registry): a restore continues its trace."""
    tracestate: str | None = None
    inherited_from: int | None = None
    """The attempt whose ``job.started`` filled in identity the checkpoint does not carry
    (`with_inherited_identity`), if any."""
    copies: tuple[str, ...] = ()
    """Where its verified copies are (a tier that replicates), the most recently verified
    first: a restore uses one when the primary is gone, unreadable or condemned
    (`from_copy`)."""
    source: str | None = None
    """Why ``uri`` is a copy and not the primary (None: it is the primary)."""
    failed_at: tuple[str, ...] = ()
    """Its locations (primary or copies) that failed to load before and are excluded
    (`Exclusions`): ``copies`` no longer holds them; the plan's reason names them."""


CONDEMNED = frozenset({CheckpointState.CORRUPT, CheckpointState.QUARANTINED})
"""Primary states a verified copy still restores from: the bytes at the primary are bad or
gone, the checkpoint (same id, same checksums) survives in its copy."""


LOAD_FAILED = "failed to load (excluded after a load failure)"
"""What is wrong with a primary that a load failure ruled out (`Exclusions`)."""


def from_copy(candidate: Candidate, why: str) -> Candidate:
    """``candidate`` restored from its newest verified copy instead of its primary (``why``:
    what is wrong with the primary); unchanged when it has no copy. The reason names the copy,
    and the copies skipped because they failed to load before."""
    if not candidate.copies:
        return candidate
    copy = candidate.copies[0]
    note = f"primary {candidate.uri} {why}: restoring from its verified copy {copy}"
    skipped = [u for u in candidate.failed_at if u != candidate.uri]
    if skipped:
        note += f" (copies that failed to load before: {', '.join(skipped)})"
    return replace(candidate, uri=copy, source=note)


def without_failed(candidate: Candidate, failed: Iterable[str]) -> Candidate:
    """``candidate`` with the locations that failed to load left out of its copies (and noted
    in ``failed_at``)."""
    out = frozenset(failed)
    if not out:
        return candidate
    tried = tuple(u for u in (candidate.uri, *candidate.copies) if u in out)
    copies = tuple(u for u in candidate.copies if u not in out)
    return replace(candidate, copies=copies, failed_at=tried)


def restorable(candidate: Candidate) -> Candidate | None:
    """The candidate as a restore would use it: valid at its primary, or with a verified copy
    when its primary is condemned or failed to load before (then from that copy); None: not
    restorable (every location failed, or none is valid)."""
    if candidate.state is not CheckpointState.VALID and candidate.state not in CONDEMNED:
        return None
    if candidate.uri in candidate.failed_at:
        return from_copy(candidate, LOAD_FAILED) if candidate.copies else None
    if candidate.state is CheckpointState.VALID:
        return candidate
    if candidate.copies:
        return from_copy(candidate, f"is {candidate.state.value}")
    return None


INHERITED = ("environment", "topology", "code_version")
"""What a checkpoint without its own identity takes from the attempt that was running when it
appeared: what that attempt declared it runs on at ``job.started``."""


def lacks_identity(candidate: Candidate) -> bool:
    """The checkpoint records no identity, or not all of what a restore is checked against."""
    identity = candidate.identity
    return identity is None or any(getattr(identity, f) is None for f in INHERITED)


def writer_attempt(candidate: Candidate, starts: Sequence[Started]) -> Started | None:
    """The attempt that wrote ``candidate``: the one its identity names (same run and attempt),
    else, for a checkpoint with no identity, the newest attempt started before it appeared."""
    identity = candidate.identity
    if identity is not None:
        return next(
            (s for s in starts if (s.run_id, s.attempt) == (identity.run_id, identity.attempt)),
            None,
        )
    if candidate.created_at is None:
        return None
    before = [s for s in starts if s.at <= candidate.created_at]
    return max(before, key=lambda s: (s.at, s.attempt), default=None)


def with_inherited_identity(candidate: Candidate, job: str, starts: Sequence[Started]) -> Candidate:
    """R14 for checkpoints written by plain ``dcp.save`` or a Trainer without ckpt-ha's callback:
    what they do not record (environment, topology, code version) is what the attempt that
    wrote them declared at ``job.started``, bound by job, run, attempt and time. Fields the
    checkpoint records itself are never overridden; nothing known → unchanged."""
    if not lacks_identity(candidate):
        return candidate
    identity = candidate.identity
    writer = writer_attempt(candidate, starts)
    if writer is None:
        return candidate
    base = identity or CheckpointIdentity(
        job_id=job, run_id=writer.run_id, attempt=writer.attempt, created_at=candidate.created_at
    )
    filled = base.model_copy(
        update={
            "environment": base.environment or writer.environment,
            "topology": base.topology or writer.topology,
            "code_version": base.code_version or writer.code_version,
        }
    )
    return replace(candidate, identity=filled, inherited_from=writer.attempt)


@dataclass(frozen=True)
class Selection:
    chosen: Candidate | None
    previous: Candidate | None
    """The next older valid checkpoint: kept pinned as fallback (R15)."""
    verifying: Candidate | None = None
    """The newest checkpoint newer than ``chosen`` still pending verification, if any: committed
    with its evidence, not yet checked (`verification_to_await`)."""


def select(newest_first: Iterable[Candidate], excluded: Iterable[str] = ()) -> Selection:
    """The newest valid checkpoint not excluded, the one after it, and the newest one still
    being verified above them. Exclusions are per location (`Exclusions`): a checkpoint whose
    primary failed to load, or is condemned, but which has a verified copy that has not failed
    counts as valid, restored from that copy (`restorable`); it is passed over only when every
    location of it is excluded or invalid."""
    skip = Exclusions.of(excluded)
    picked: list[Candidate] = []
    verifying: Candidate | None = None
    for c in newest_first:
        if skip.everywhere(c.checkpoint_id) or c.step is None:
            continue
        c = without_failed(c, skip.at(c.checkpoint_id))
        if c.state is CheckpointState.PENDING_VERIFICATION and not picked and verifying is None:
            verifying = c
        usable = restorable(c)
        if usable is not None:
            picked.append(usable)
            if len(picked) == 2:
                break
    return Selection(
        picked[0] if picked else None, picked[1] if len(picked) > 1 else None, verifying
    )


def verification_to_await(
    selection: Selection, failed_at: datetime, now: datetime, grace_s: float
) -> Candidate | None:
    """The checkpoint a fresh failure should wait for before it is decided, if any.

    A job that crashes right after a save leaves its newest checkpoints committed but not yet
    verified: deciding at once restores an older one (more to recompute) or, when none is valid
    yet, escalates `no_valid_checkpoint` although a good checkpoint is seconds from valid. Until
    ``grace_s`` after the failure, the newest one pending verification (newer than the chosen
    one) is waited for; after it, the failure is decided with what is valid then."""
    if selection.verifying is None or not within_grace(failed_at, now, grace_s):
        return None
    return selection.verifying


def within_grace(failed_at: datetime, now: datetime, grace_s: float) -> bool:
    """Whether a fresh failure may still wait for a checkpoint on its way (`verification_to_
    await`, `awaits_commit`): until ``grace_s`` after it; then it is decided with what is
    valid."""
    return (now - failed_at).total_seconds() < grace_s


def awaits_commit(committed_at: datetime, failed_at: datetime) -> bool:
    """Whether a fresh failure, `within_grace`, waits for the registry to record the job's
    newest commit (made at ``committed_at``), if it has not yet.

    A job that crashes a moment after a save can be heard failing before the registrar has
    handled that save's commit: deciding then restores an older checkpoint, and the commit,
    handled after the plan, is fenced as a stale writer's (R17) although it was written before
    the failure. So a commit made before the failure is waited for (once registered, the wait
    for its verification, `verification_to_await`, takes over). One made at or after the
    failure is a stale writer's: never waited for."""
    return committed_at < failed_at


def fenced(plan: PlanRecord | None, sent_at: datetime) -> bool:
    """Whether a report of the attempt ``plan`` resumes from (R17) is a stale writer's: sent
    at or after that attempt's failure. One sent before it is the attempt's own progress, read
    late (a coordinator catching up), and counts: the answer depends on the report and the plan,
    never on the order they are read in."""
    return plan is not None and sent_at >= plan.failed_at


@functools.lru_cache(maxsize=16_384)
def plan_id(job_id: str, run_id: str, failed_attempt: int) -> str:
    """One plan per failure: the same failure, heard twice or by two replicas, names one plan.
    (Cached: every progress report asks for the plan that would fence it, and a running
    attempt asks again with each report.)"""
    return str(uuid.uuid5(PLAN_NAMESPACE, f"{job_id}|{run_id}|{failed_attempt}"))
