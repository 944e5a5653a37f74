"""Checkpoint interval advice (R3): the advisor's inputs, either given by the operator or
measured from a job's registry records and the restore coordinator's failure log. Every given
value overrides the measured one; every measured one says how it was measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Protocol

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core import interval
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.ops.errors import NothingToMeasure
from ckpt_ha.registry.port import CheckpointReader
from ckpt_ha.restore_coordinator import api as restores
from ckpt_ha.restore_coordinator.api import Failure

DEFAULT_PRIOR_MTBF_S = 24 * 3600.0


@dataclass(frozen=True)
class Given:
    """What the operator passed; None: measure it (with a job) or use the model's default."""

    write_s: float | None = None
    mtbf_s: float | None = None
    restart_s: float | None = None
    current_s: float | None = None
    checkpoint_bytes: float | None = None
    keep: int | None = None
    prior_mtbf_s: float = DEFAULT_PRIOR_MTBF_S


@dataclass(frozen=True)
class Inputs:
    """Exactly the arguments of `interval.advise`."""

    write_s: float
    mtbf_s: float
    restart_s: float = 0.0
    current_s: float | None = None
    checkpoint_bytes: float | None = None
    keep: int | None = None

    def advise(self) -> interval.Advice:
        """Raises `interval.BadInput` for a value the model cannot use."""
        return interval.advise(**asdict(self))


def given_only(given: Given) -> Inputs:
    """The inputs without a job: write time and MTBF must be given."""
    if given.write_s is None or given.mtbf_s is None:
        raise ValueError("write time and MTBF must be given without a job")
    return Inputs(
        write_s=given.write_s,
        mtbf_s=given.mtbf_s,
        restart_s=given.restart_s or 0.0,
        current_s=given.current_s,
        checkpoint_bytes=given.checkpoint_bytes,
        keep=given.keep,
    )


def checkpoint_times(record: CheckpointRecord) -> interval.CheckpointTimes:
    """When a record's write started and was committed, from its history (see `interval`)."""

    def first(state: CheckpointState) -> datetime | None:
        return next((h.at for h in record.history if h.state is state), None)

    started = first(CheckpointState.WRITING)
    if started is None and record.identity is not None:
        started = record.identity.created_at  # the writer's clock when it began the save
    return interval.CheckpointTimes(
        started=started,
        committed=first(CheckpointState.PENDING_VERIFICATION),
        run_id=record.run_id,
        total_bytes=record.total_bytes,
    )


def measure(
    job_id: str,
    records: Sequence[CheckpointRecord],
    failures: Sequence[datetime],
    given: Given,
) -> tuple[Inputs, list[str]]:
    """The inputs for ``job_id`` and the notes on where each came from. ``failures``: when each
    of the job's attempts failed (the restore coordinator's log). Pure."""
    if not records:
        raise NothingToMeasure(
            job_id, f"no checkpoints registered for job {job_id}: nothing to measure"
        )
    times = [checkpoint_times(r) for r in records]
    sources: dict[str, str] = {}
    notes: list[str] = []

    write_s = given.write_s
    if write_s is None:
        est = interval.write_time(times)
        if est.value is None:
            raise NothingToMeasure(
                job_id,
                f"job {job_id}: no checkpoint with both a write start and a commit time; "
                "pass --write-seconds",
            )
        write_s, sources["write_seconds"] = est.value, f"measured: {est.how}"
    mtbf_s = given.mtbf_s
    if mtbf_s is None:
        activity = [t for c in times for t in (c.started, c.committed) if t is not None]
        m = interval.mtbf(failures, activity, given.prior_mtbf_s)
        assert m.value is not None
        mtbf_s = m.value
        sources["mtbf_seconds"] = (
            f"estimated from {m.failures} failure(s) in the restore coordinator's log "
            f"({restores.key('<prefix>', 'failures', job_id)}): {m.how}"
        )
        notes.extend(m.notes)
    current_s = given.current_s
    if current_s is None:
        est = interval.current_interval(times, write_s)
        current_s = est.value
        sources["current_interval_seconds"] = f"measured: {est.how}"
    size = given.checkpoint_bytes
    if size is None:
        est = interval.checkpoint_size(times)
        size = est.value
        if size is not None:
            sources["checkpoint_bytes"] = f"measured: {est.how}"
    if given.restart_s is None:
        notes.append("restart time not measured: assumed 0 (pass --restart-seconds)")
    inputs = Inputs(
        write_s=write_s,
        mtbf_s=mtbf_s,
        restart_s=given.restart_s or 0.0,
        current_s=current_s,
        checkpoint_bytes=size,
        keep=given.keep,
    )
    return inputs, [f"{k}: {v}" for k, v in sources.items()] + notes


class FailureLog(Protocol):
    """The restore coordinator's failure log, read through its published reader
    (`ckpt_ha.restore_coordinator.api.RestoreReader`)."""

    async def failures(self, job: str) -> list[Failure]: ...


async def measured(
    registry: CheckpointReader, restores: FailureLog, job_id: str, given: Given
) -> tuple[Inputs, list[str]]:
    """`measure` on what the registry and the coordinator's failure log hold for ``job_id``
    (a job.failed heard twice is one entry there)."""
    records = await registry.by_job(job_id)
    failures = [f.at for f in await restores.failures(job_id)]
    return measure(job_id, records, failures, given)
