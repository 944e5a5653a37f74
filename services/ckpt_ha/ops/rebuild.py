"""Rebuild the registry from the event stream: everything under the registry prefix that the
system decided is a projection of it.

An operation (not part of the registry package): it reads the bus and replays through the
services' own projections, which sit above the registry in the import layers.

Refuses (`StreamIncomplete`) a stream that no longer starts at sequence 1. Replays the whole
stream in stream order, streamed (it never holds the stream in memory: one batch of `BATCH`
checkpoint events, projected in one `Registry.apply_many` round trip, plus the few deferred),
through the projections the live services use:

* checkpoint events → the registry (`RegistryWriter.apply`, the registrar's projection: records,
  indexes, owners, chosen tiers), after the same intake check (a location its job does not own
  is refused). Events the live consumer dead-lettered fail here the same way and are skipped;
  one that arrived before the one it depends on (which the live consumer nak'ed and retried) is
  deferred and retried after the rest, as redelivery did;
* ``resume.planned`` → the registry too: the fences of runs (R17, the registrar's second
  consumer), in stream order with the commits. The live registrar reads plans through their own
  consumer, so a commit it heard just before a plan it had not yet read stayed unfenced there;
  a replay judges it against the stream's order;
* ``job.started`` → the tier it declares (`ckpt_ha.core.tiers.declared_tier`, what the
  retention-janitor records);
* job, resume and ``checkpoint.registered`` events → the restore-coordinator's state and the R15
  pins (through the coordinator's own projection, `ckpt_ha.restore_coordinator.replay`), on the
  events' own clock, so state the live coordinator let expire is not brought back;
* ``resume.planned``, ``resume.verified``, ``resume.diverged``, ``job.started`` and
  ``checkpoint.registered`` → the retention-janitor's own view of resumes (its plans, verdicts,
  resumed starts and pins: `ckpt_ha.retention_janitor.projection`), in stream order.

Progress and heartbeats (`ckpt_ha.contracts.subjects.TELEMETRY`) live in the progress stream,
under limits: nothing decided depends on them alone. Every decision the coordinator took from
reports (a continuity verdict, an attempt declared lost) is an event in the event stream. The
rebuild still replays what the progress stream kept, merged with the events by time
(`iter_history`): the newest reports of each job give its liveness watch its last sign of life
(without them a running attempt would look silent since its start and be declared lost at
once) and the trajectory a pending continuity verdict compares with. Reports the limits dropped
(older than ``CKPT_HA_PROGRESS_MAX_AGE_S``, or beyond the newest ``CKPT_HA_PROGRESS_PER_JOB``)
are not replayed; the event stream alone still has to start at sequence 1.

Not replayed: leases (transient) and the reconcile log (not in the stream: a rebuild keeps it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import iter_history
from ckpt_ha.contracts import CATALOG, Envelope, EventCatalog, EventData
from ckpt_ha.contracts.checkpoint import CheckpointRegisteredV1
from ckpt_ha.contracts.errors import ContractError
from ckpt_ha.contracts.job import JobHeartbeatV1, JobProgressV1, JobStartedV1
from ckpt_ha.contracts.resume import ResumePlannedV1
from ckpt_ha.contracts.subjects import event_filter
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.core.errors import DependencyNotReady, PermanentError
from ckpt_ha.core.locations import KeyOf, intake_refusal
from ckpt_ha.core.tiers import declared_tier
from ckpt_ha.ops.errors import (
    RebuildWithoutSigningKey,
    RegistryNotEmpty,
    StreamIncomplete,
    StreamReplaced,
)
from ckpt_ha.ops.streams import require_complete_stream
from ckpt_ha.registry.pins import ReplayedPins
from ckpt_ha.registry.port import RegistryWriter, TierDeclarer
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.restore_coordinator.replay import RestoreReplay, restore_replay
from ckpt_ha.retention_janitor.api import RedisResumes, ResumeViewReplay

COORDINATED = ("job.", "resume.")
"""Event types (by prefix) the restore-coordinator's state is projected from, besides
``checkpoint.registered`` (the pins it releases)."""


BATCH = 500
"""Checkpoint events projected per registry round trip (`Registry.apply_many`)."""

Progress = Callable[[int, int | None], None]
"""``(events read, None)``: the stream's length is not known ahead."""


@dataclass
class RebuildReport:
    read: int = 0
    applied: int = 0
    """Checkpoint events projected into the registry."""
    duplicates: int = 0
    replayed: int = 0
    """Job and resume events projected (the coordinator's state, pins, declared tiers)."""
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, code: str) -> None:
        self.skipped[code] = self.skipped.get(code, 0) + 1

    def to_json(self) -> dict[str, object]:
        return {
            "read": self.read,
            "applied": self.applied,
            "duplicates": self.duplicates,
            "replayed": self.replayed,
            "skipped": dict(sorted(self.skipped.items())),
        }


class RegistryReplay(RegistryWriter, TierDeclarer, Protocol):
    """The registry's side of a replay: checkpoint events and declared tiers."""


async def rebuild(
    registry: RegistryReplay,
    cfg: BusConfig,
    catalog: EventCatalog,
    key_of: KeyOf,
    *,
    restores: RestoreReplay | None = None,
    resumes: ResumeViewReplay | None = None,
    clock: Clock = utc_now,
    progress: Progress | None = None,
    batch: int = BATCH,
) -> RebuildReport:
    """``key_of``: a location's key in the storage root, as the live registrar had it (an event
    naming a location its job does not own is refused here as it was there). ``restores``: the
    coordinator's state to replay too, ``resumes``: the janitor's view (None: the registry's
    key spaces only). ``batch``:
    checkpoint events per registry round trip (the result does not depend on it). Refuses
    (`StreamIncomplete`) a stream whose first events are gone, and a rebuild without the
    job-signing key (`RebuildWithoutSigningKey`)."""
    if not cfg.signing_keys:
        raise RebuildWithoutSigningKey
    await require_complete_stream(cfg)
    return await _replay(
        registry, cfg, catalog, key_of, restores, clock, progress, batch, resumes=resumes
    )


UNREAD = (JobProgressV1, JobHeartbeatV1, JobStartedV1, CheckpointRegisteredV1)
"""Coordinated events whose projection reads nothing of the registry (the frequent ones): the
checkpoint events before them need not be written first."""


class RegistryBatch:
    """Checkpoint events held until `BATCH` of them are projected in one `apply_many`, in
    stream order. An event that came before the one it depends on (the live consumer nak'ed it
    and heard it again) is deferred and retried after the rest, as redelivery did."""

    def __init__(self, registry: RegistryReplay, report: RebuildReport, size: int) -> None:
        self.registry = registry
        self.report = report
        self.size = size
        self.pending: list[Envelope[EventData]] = []
        self.deferred: list[Envelope[EventData]] = []

    async def add(self, event: Envelope[EventData]) -> None:
        self.pending.append(event)
        if len(self.pending) >= self.size:
            await self.flush()

    async def flush(self) -> None:
        if not self.pending:
            return
        events, self.pending = self.pending, []
        await _apply(self.registry, events, self.report, self.deferred.append)

    async def retry(self) -> None:
        """Deferred checkpoint events, again and again while any of them applies."""
        await self.flush()
        pending, self.deferred = self.deferred, []
        while pending:
            deferred: list[Envelope[EventData]] = []
            for start in range(0, len(pending), self.size):
                chunk = pending[start : start + self.size]
                await _apply(self.registry, chunk, self.report, deferred.append)
            if len(deferred) == len(pending):
                for _ in deferred:
                    self.report.skip(DependencyNotReady.code)
                return
            pending = deferred


async def _replay(
    registry: RegistryReplay,
    cfg: BusConfig,
    catalog: EventCatalog,
    key_of: KeyOf,
    restores: RestoreReplay | None,
    clock: Clock,
    progress: Progress | None = None,
    batch: int = BATCH,
    *,
    resumes: ResumeViewReplay | None = None,
) -> RebuildReport:
    report = RebuildReport()
    checkpoints = RegistryBatch(registry, report, batch)
    # A checkpoint's events name its location again and again (writing, committed, verified,
    # registered, ...): each is resolved once while they come.
    key_of = functools.lru_cache(maxsize=4096)(key_of)
    async with aclosing(iter_history(cfg, catalog, event_filter(cfg.prefix))) as stream:
        async for item in stream:
            report.read += 1
            if progress is not None:
                progress(report.read, None)
            if isinstance(item, ContractError):
                report.skip(item.code)
                continue
            if item.event_type.startswith("checkpoint.") or isinstance(item.data, ResumePlannedV1):
                refused = intake_refusal(item.data, key_of)
                if refused is not None:
                    report.skip(refused.code)
                else:
                    await checkpoints.add(item)
            if item.event_type.startswith(COORDINATED) or isinstance(
                item.data, CheckpointRegisteredV1
            ):
                if not isinstance(item.data, UNREAD):
                    await checkpoints.flush()  # it may read what the events before it wrote
                await _coordinated(registry, restores, item, report)
            if resumes is not None:
                await resumes.apply(item)
    await checkpoints.retry()
    if restores is not None:
        await restores.finish(clock())
    return report


async def _apply(
    registry: RegistryReplay,
    events: list[Envelope[EventData]],
    report: RebuildReport,
    defer: Callable[[Envelope[EventData]], None],
) -> None:
    """One round trip for ``events``; each event's own error decides what happens to it."""
    results = await registry.apply_many(events)
    for event, result in zip(events, results, strict=True):
        if isinstance(result, DependencyNotReady):
            defer(event)
        elif isinstance(result, PermanentError):
            report.skip(result.code)
        elif isinstance(result, Exception):
            raise result
        elif result.duplicate:
            report.duplicates += 1
        else:
            report.applied += 1


async def _coordinated(
    tiers: TierDeclarer,
    restores: RestoreReplay | None,
    event: Envelope[EventData],
    report: RebuildReport,
) -> None:
    data = event.data
    if isinstance(data, JobStartedV1):
        await tiers.declare_tier(data.job_id, declared_tier(data))
    if restores is not None:
        try:
            await restores.apply(event)
        except PermanentError as exc:
            report.skip(exc.code)
            return
    if not isinstance(data, CheckpointRegisteredV1):
        report.replayed += 1


async def rebuild_registry(
    registry: Registry,
    bus: BusConfig,
    key_of: KeyOf,
    *,
    clear: bool,
    accept_new_stream: bool = False,
    trajectory_limit: int = 10_000,
    state_ttl_s: int = 30 * 24 * 3600,
    catalog: EventCatalog = CATALOG,
    clock: Clock = utc_now,
    progress: Progress | None = None,
) -> RebuildReport:
    """Everything under the registry's prefix from the stream: the registry, declared tiers,
    the restore-coordinator's state and the pins, the retention-janitor's view of resumes.
    ``trajectory_limit`` and ``state_ttl_s``: the coordinator's (``CKPT_HA_TRAJECTORY_LIMIT``,
    ``CKPT_HA_STATE_TTL_S``, the janitor's too), so the replayed state is trimmed and expires as
    the live one. A registry with anything under its prefix is
    refused (`RegistryNotEmpty`) unless ``clear``: then every key space the rebuild owns is
    emptied first (the reconcile log is kept). A stream that is not the one the registry was
    built from (deleted and created again: `StreamReplaced`) is refused before anything is
    cleared, unless ``accept_new_stream``; so is a rebuild without the job-signing key
    (`RebuildWithoutSigningKey`). Stop the registrar, the restore-coordinator and
    the retention-janitor first: they write these keys too."""
    if not bus.signing_keys:
        raise RebuildWithoutSigningKey  # before anything is cleared
    current = await require_complete_stream(bus)
    recorded = await registry.built_from()
    if recorded is not None and recorded != current and not accept_new_stream:
        raise StreamReplaced(recorded, current)
    pins = ReplayedPins(registry.r, registry.p)  # emptied below, unless empty already
    replay = restore_replay(
        registry.r,
        registry.p,
        pins,
        registry,
        trajectory_limit=trajectory_limit,
        ttl_s=state_ttl_s,
    )
    view = RedisResumes(registry.r, registry.p, state_ttl_s)
    if await registry.dump():
        if not clear:
            raise RegistryNotEmpty
        await registry.clear()
        await replay.clear()
        await pins.clear()
        await view.clear()
    report = await _replay(
        registry, bus, catalog, key_of, replay, clock, progress, resumes=ResumeViewReplay(view)
    )
    await registry.remember_stream(current, replace=True)
    return report


@dataclass(frozen=True)
class RebuildPreview:
    """What `rebuild_registry` would do, found without changing anything (``--dry-run``, and
    what the person is asked to confirm)."""

    keys: int
    """Keys under the prefix now (leases aside): `--clear` deletes them all but the reconcile
    log."""
    refusals: tuple[str, ...]
    """Why it would be refused, each as the refusal would say it (none: it would run)."""


async def preview(
    registry: Registry, bus: BusConfig, *, clear: bool, accept_new_stream: bool = False
) -> RebuildPreview:
    """The checks `rebuild_registry` makes before it clears anything, and what it would clear."""
    refusals: list[str] = []
    if not bus.signing_keys:
        refusals.append(str(RebuildWithoutSigningKey()))
    current: str | None = None
    try:
        current = await require_complete_stream(bus)
    except StreamIncomplete as exc:
        refusals.append(str(exc))
    recorded = await registry.built_from()
    if current and recorded and recorded != current and not accept_new_stream:
        refusals.append(str(StreamReplaced(recorded, current)))
    keys = 0
    async for key in registry.r.scan_iter(match=registry.keys.everything, count=1000):
        keys += not registry.keys.is_transient(key)
    if keys and not clear:
        refusals.append(str(RegistryNotEmpty()))
    return RebuildPreview(keys, tuple(refusals))
