"""The janitor's round and its consumers: read, `domain.plan`, then do exactly what it says.

A round is level-triggered: it reads the registry and the references afresh, never relies on
having seen an event. Expiry is only an event (the registrar records it). Deletion removes the
bytes first, lists again to see them gone, and only then publishes ``checkpoint.deleted`` (the
tombstone); a storage failure leaves the checkpoint expired and the next round retries, so the
registry never says "deleted" while bytes remain, nor hides that they do.

The references come from the janitor's own view of resumes (`ResumeView`), which its consumers
keep from the events (`ResumeHandlers`, `ckpt_ha.retention_janitor.projection`). Ordering (R6,
R15): the coordinator stores a plan and then publishes its ``resume.planned``; the janitor used
to read the stored plan, and now reads the plan once it applied that event. So that no round
decides in the window between the two, a round starts only when the view has applied every
``resume.planned`` published so far (`ResumeFeed.caught_up`; else `ResumesBehind`: the periodic
round waits for the next one, a round for a registration is redelivered with backoff). A plan
decided before the round began is then always seen, as it was when the plan was read from the
coordinator's state; one decided while the round runs was not seen then either. And only an
expiry can follow from such a miss: deletion waits for the tier's grace period, and every
round in it sees the plan and keeps the checkpoint. A registration releases pins (through its
own durable, ``released``) only after the same check, so the plan whose pins it releases has
been applied, as the coordinator had stored it before it released them; and only a plan
decided before the registration (`ckpt_ha.retention_janitor.projection`), so that a durable
replaying the stream from its start cannot release a later plan's pins early.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointDeletedV1,
    CheckpointExpiredV1,
    CheckpointRegisteredV1,
    CheckpointState,
)
from ckpt_ha.contracts.job import JobStartedV1
from ckpt_ha.core.errors import DependencyNotReady
from ckpt_ha.core.locations import LocationNotOwned
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import declared_tier
from ckpt_ha.retention_janitor import adapters, domain, projection
from ckpt_ha.retention_janitor.domain import Action, Decision
from ckpt_ha.retention_janitor.metrics import RetentionMetrics
from ckpt_ha.retention_janitor.ports import (
    Clock,
    ObjectStore,
    Publisher,
    ResumeFeed,
    ResumeView,
    RetentionRegistry,
    TombstoneArchive,
)
from ckpt_ha.runtime.leader import next_round
from ckpt_ha.storage import StorageError, key_for_uri
from ckpt_ha.telemetry import tracing

__all__ = [
    "Janitor",
    "JanitorHandlers",
    "ResumeHandlers",
    "ResumesBehind",
    "RoundResult",
    "plan_round",
]

ARCHIVE_BATCH = 200
"""Tombstones read, archived, then removed from the registry, per step of
`move_cold_tombstones` (the hot ones are read too: memory stays one page)."""
ARCHIVE_EVERY = timedelta(hours=1)
"""How often the periodic rounds move old tombstones (their age is counted in days; a move
reads every tombstone still in the registry)."""
SOURCE = "ckpt-ha/retention-janitor"
ACTOR = "retention-janitor"
log = logging.getLogger("ckpt_ha.retention_janitor")


class ResumesBehind(DependencyNotReady):
    """The janitor's view of resumes has not yet applied every ``resume.planned`` published:
    no retention decision until it has (see the module doc)."""

    def __init__(self, what: str) -> None:
        super().__init__(what, "every resume.planned published before it")


@dataclass
class RoundResult:
    decisions: list[Decision]
    expired: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    """Checkpoint id → why its deletion did not happen this round (retried next round)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Checkpoint id → why a planned deletion was not carried out (it changed since)."""


async def plan_round(
    registry: RetentionRegistry,
    resumes: ResumeView,
    now: datetime,
    jobs: Iterable[str] | None = None,
) -> list[Decision]:
    """What a round would do at ``now`` (``ckpt-ha retention plan``): the same read and the same
    `domain.plan` a real round carries out."""
    views = await adapters.job_views(registry, resumes, now, jobs)
    return domain.plan(views, now)


class Janitor:
    def __init__(
        self,
        registry: RetentionRegistry,
        resumes: ResumeView,
        feed: ResumeFeed,
        store: ObjectStore,
        bus: Publisher,
        clock: Clock,
        metrics: RetentionMetrics,
        *,
        archive: TombstoneArchive | None = None,
        hot: timedelta = timedelta(0),
    ) -> None:
        """``archive`` and ``hot``: tombstones deleted longer than ``hot`` ago move there
        (`move_cold_tombstones`); none, or a zero ``hot``: they stay in the registry."""
        self.registry = registry
        self.archive = archive
        self.hot = hot
        self._moved_at: datetime | None = None
        self.resumes = resumes
        self.feed = feed
        self.store = store
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self._lock = asyncio.Lock()

    async def dry_run(self, jobs: Iterable[str] | None = None) -> list[Decision]:
        return await plan_round(self.registry, self.resumes, self.clock(), jobs)

    async def caught_up(self, what: str) -> None:
        """Raise `ResumesBehind` unless the view has applied every ``resume.planned``
        published so far."""
        if not await self.feed.caught_up():
            raise ResumesBehind(what)

    async def run_once(self, jobs: Iterable[str] | None = None) -> RoundResult:
        """One round: plan, then expire and delete exactly what the plan says. Not before the
        view of resumes has caught up (`ResumesBehind`)."""
        await self.caught_up("a retention round")
        async with self._lock:
            decisions = await self.dry_run(jobs)
            result = RoundResult(decisions)
            storage_down: str | None = None
            for d in domain.actionable(decisions):
                if d.action is Action.EXPIRE:
                    await self._expire(d)
                    result.expired.append(d.checkpoint_id)
                elif storage_down is not None:
                    result.failed[d.checkpoint_id] = storage_down
                else:
                    storage_down = await self._delete(d, result)
            if storage_down is not None:
                self.metrics.delete_failures.labels(self.metrics.service).inc(len(result.failed))
                log.warning("deletions stopped this round, retried next round: %s", storage_down)
            if jobs is None:
                self._gauge(decisions)
                if storage_down is None:
                    now = self.clock().timestamp()
                    self.metrics.last_round.labels(self.metrics.service).set(now)
            return result

    async def _expire(self, d: Decision) -> None:
        data = CheckpointExpiredV1(
            job_id=d.job_id,
            checkpoint_id=d.checkpoint_id,
            uri=d.uri,
            reason=d.reason,
            policy=d.policy,
            grace_until=d.grace_until,
            tier=d.tier,
            actor=ACTOR,
        )
        record = await self.registry.get(d.checkpoint_id)
        # In the checkpoint's own trace (linked to this round), like every transition of it.
        with self._in_trace("retention.expire", record, d):
            # Keyed on the checkpoint: a round repeated before the registrar recorded it is
            # deduped.
            await self._publish(data, key=f"expire:{d.checkpoint_id}")
        self.metrics.decisions.labels(self.metrics.service, d.tier, "expire").inc()

    async def _delete(self, d: Decision, result: RoundResult) -> str | None:
        """Delete one expired checkpoint's bytes, then publish its tombstone. Returns why storage
        failed (the round stops deleting), or None."""
        record = await self.registry.get(d.checkpoint_id)
        if record is None or not domain.still_deletable(record):
            result.skipped[d.checkpoint_id] = "changed since the plan was read"
            return None
        if key_for_uri(self.store, record.uri) is None:
            # Never "deleted" while bytes may remain somewhere this janitor cannot reach.
            result.failed[d.checkpoint_id] = f"{record.uri} is outside this janitor's storage root"
            return None
        try:
            removals = await adapters.removals(self.store, self.registry, record)
        except LocationNotOwned as exc:
            # Never delete where the record's job does not own the bytes (a record registered
            # before ownership was checked): a human decides.
            result.skipped[d.checkpoint_id] = str(exc)
            log.warning("not deleting %s: %s", d.checkpoint_id, exc)
            return None
        try:
            removed = await adapters.to_thread_remove(self.store, removals)
        except StorageError as exc:
            result.failed[d.checkpoint_id] = str(exc)
            return str(exc)
        data = CheckpointDeletedV1(
            job_id=d.job_id,
            checkpoint_id=d.checkpoint_id,
            uri=d.uri,
            reason=domain.tombstone_reason(d.reason, removed.notes),
            actor=ACTOR,
            policy=d.policy,
            tier=d.tier,
            objects_deleted=removed.deleted,
        )
        with self._in_trace("retention.delete", record, d):
            await self._publish(data, key=f"delete:{d.checkpoint_id}")
        self.metrics.decisions.labels(self.metrics.service, d.tier, "delete").inc()
        result.deleted.append(d.checkpoint_id)
        return None

    def _gauge(self, decisions: list[Decision]) -> None:
        counts = Counter(
            (d.tier, p.kind.value)
            for d in decisions
            if d.action is Action.KEEP
            for p in d.protected_by[:1]
        )
        self.metrics.protected.clear()
        for (tier, kind), n in counts.items():
            self.metrics.protected.labels(self.metrics.service, tier, kind).set(n)
        self.metrics.job_tier.replace({(d.job_id, d.tier): 1.0 for d in decisions})
        states = Counter((d.tier, d.state.value) for d in decisions)
        self.metrics.checkpoints.clear()
        for (tier, state), n in states.items():
            self.metrics.checkpoints.labels(self.metrics.service, tier, state).set(n)

    @staticmethod
    def _in_trace(
        name: str, record: CheckpointRecord | None, d: Decision
    ) -> AbstractContextManager[object]:
        return tracing.continue_trace(
            name,
            record.traceparent if record is not None else None,
            tracestate=record.tracestate if record is not None else None,
            attributes={
                "ckpt_ha.job_id": d.job_id,
                "ckpt_ha.checkpoint_id": d.checkpoint_id,
                "ckpt_ha.tier": d.tier,
                "ckpt_ha.reason": d.reason[:200],
            },
        )

    async def _publish(self, data: CheckpointExpiredV1 | CheckpointDeletedV1, key: str) -> None:
        await self.bus.publish(build(data, source=SOURCE, time=self.clock(), key=key))

    async def move_cold_tombstones(self) -> list[str]:
        """Move the tombstones deleted longer than ``hot`` ago from the registry to the archive
        (R6): each batch is written to the archive first and only then removed from the
        registry, so a crash in between leaves a tombstone in both, never in neither (the next
        round writes it again and removes it). Returns the ids removed from the registry."""
        if self.archive is None:
            return []
        now, moved = self.clock(), []
        async for page in self.registry.by_state_pages(CheckpointState.DELETED, ARCHIVE_BATCH):
            cold = domain.cold_tombstones(page, now, self.hot)
            if cold:
                await self.archive.put(cold)
                moved += await self.registry.forget_tombstones(cold)
        self._moved_at = now
        if moved:
            self.metrics.archived.labels(self.metrics.service).inc(len(moved))
            log.info("moved %d tombstone(s) to the archive", len(moved))
        return moved

    async def run(self, interval_s: float) -> None:
        """Rounds forever; an outage ends a round early and the next one retries."""
        while True:
            try:
                await self.run_once()
                if self._moved_at is None or self.clock() - self._moved_at >= ARCHIVE_EVERY:
                    await self.move_cold_tombstones()
            except ResumesBehind:
                log.warning("resume events still being applied; retention waits for next round")
            except Exception:  # one failed round must not stop the janitor
                log.exception("retention round failed; retrying in %.0f s", interval_s)
            await next_round(interval_s)


class ResumeHandlers:
    """Keeps the janitor's view of resumes: each event through `projection.apply`."""

    def __init__(self, view: ResumeView) -> None:
        self.view = view

    async def on_event(self, event: Envelope[EventData]) -> None:
        """``resume.planned``, ``resume.verified``, ``resume.diverged`` (and, from the
        janitor's other consumers, ``job.started`` and ``checkpoint.registered``)."""
        keep_s = self.view.keep_s
        await self.view.update(event.data.job_id, lambda v: projection.apply(v, event, keep_s))


class JanitorHandlers:
    def __init__(self, janitor: Janitor) -> None:
        self.janitor = janitor
        self.resumes = ResumeHandlers(janitor.resumes)

    async def on_registered(self, event: Envelope[CheckpointRegisteredV1]) -> None:
        """A new valid checkpoint may push an older one out of its tier's keep-last."""
        result = await self.janitor.run_once([event.data.job_id])
        if result.failed:
            log.warning("%s: deletions retried next round: %s", event.data.job_id, result.failed)

    async def on_released(self, event: Envelope[CheckpointRegisteredV1]) -> None:
        """The pins a newer valid checkpoint makes unnecessary (R15), once every plan
        published before it is in the view."""
        await self.janitor.caught_up(f"the registration of {event.data.checkpoint_id}")
        await self.resumes.on_event(event)

    async def on_started(self, event: Envelope[JobStartedV1]) -> None:
        """Record the tier the job declared (an explicit ``tier set`` still wins over it), and
        which plan the attempt resumes."""
        await self.janitor.registry.declare_tier(event.data.job_id, declared_tier(event.data))
        await self.resumes.on_event(event)
