"""The periodic scrub: re-verify every valid checkpoint against what was recorded at verification.

Bytes rot, disks fail, someone overwrites a shard in place: a checkpoint verified last week is not
necessarily intact today (R7: evidence per level, never assumed). Each round re-reads every VALID
checkpoint the registry holds, compares the checksums with those its `verified` event recorded
(and, for a tier that replicates, each valid copy on its replica: `replication.Replicator`),
and reports a mismatch, a missing file or a failed verdict as `corrupt` + `quarantined`, moving
the bytes aside first. A storage or registry outage ends the round early and is retried next
round; it is never reported as corruption.

The scrub reads through a read budget (`ReadBudget`, ``scrub_bytes_per_s``): it takes at most
that share of the storage root's bandwidth from training's reads. When a round cannot read
every valid checkpoint within its time limit (the scrub interval) at that rate, it stops there
and the next round, started at once, continues where it stopped (checkpoints in id order), as a
round cut short by an outage does: every checkpoint is still read once per pass, and a pass
takes as long as the budget needs. Where it stopped is kept in memory: a restarted or new leader
starts a pass from the beginning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.locations import LocationNotOwned
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.rotation import Order, Removal, newer, removal_of
from ckpt_ha.formats import verify
from ckpt_ha.formats.report import Report
from ckpt_ha.integrity_checker import domain
from ckpt_ha.integrity_checker.metrics import ScrubMetrics
from ckpt_ha.integrity_checker.ports import CheckpointReader, Clock, ObjectStore, Publisher
from ckpt_ha.runtime.leader import next_round
from ckpt_ha.storage import ObjectNotFound, StorageError, bounded, key_for_uri
from ckpt_ha.storage.owned import owned_key
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.storage.read_budget import BudgetedStore, ReadBudget
from ckpt_ha.telemetry import tracing

SOURCE = "ckpt-ha/integrity-checker"
log = logging.getLogger("ckpt_ha.integrity_checker.scrub")


class CopyCheck(Protocol):
    """What re-verifies a checkpoint's copies on their replicas (`replication.Replicator`)."""

    async def check_copies(self, record: CheckpointRecord, *, primary_ok: bool) -> list[str]:
        """Verify ``record``'s valid copies; the URIs of those that failed (announced)."""
        ...


@dataclass(frozen=True)
class ScrubRound:
    scrubbed: int
    corrupt: int
    complete: bool
    """False when an outage or the round's time limit cut it short."""
    resume_after: str | None = None
    """The last checkpoint id the round scrubbed when it was cut short: the next round
    continues after it (None: the next round starts a pass)."""
    paused: bool = False
    """True when the round's time limit cut it short (the scrub is behind at its budget)."""


class Scrubber:
    def __init__(
        self,
        store: ObjectStore,
        registry: CheckpointReader,
        publisher: Publisher,
        clock: Clock,
        algorithm: str,
        metrics: ScrubMetrics,
        budget: ReadBudget | None = None,
        copies: CopyCheck | None = None,
    ) -> None:
        """``budget``: the read budget on ``store``'s root (None: unlimited, still counted);
        ``copies``: what checks each checkpoint's copies on their replicas after its primary
        (None: copies are not checked)."""
        self.store = store
        self.registry = registry
        self.publisher = publisher
        self.clock = clock
        self.algorithm = algorithm
        self.metrics = metrics
        self.budget = budget or ReadBudget(0, on_read=metrics.read, on_wait=metrics.waited)
        self.metrics.budget.labels(metrics.service).set(self.budget.bytes_per_s)
        self.reads = BudgetedStore(store, self.budget)
        """What verification reads through; listing, ownership and quarantine use ``store``."""
        self.resume_after: str | None = None
        self.copies = copies
        self.left_to_watcher: set[str] = set()
        """Checkpoints a pass found gone as a whole and left to the writer-watcher (a rotation
        by `ckpt_ha.core.rotation`): one still valid and gone on the next pass is a loss."""

    async def scrub_once(self, limit_s: float | None = None) -> ScrubRound:
        """One round, traced as a trace of its own; a corruption it finds is reported in the
        checkpoint's own trace (from the registry) with a link back to the round. ``limit_s``:
        no checkpoint is started after the round has run this long (by the injected clock)."""
        with tracing.span("scrub.round") as current:
            result = await self._round(limit_s)
            current.set_attributes(
                {
                    "ckpt_ha.scrubbed": result.scrubbed,
                    "ckpt_ha.corrupt": result.corrupt,
                    "ckpt_ha.complete": result.complete,
                }
            )
            return result

    async def _round(self, limit_s: float | None) -> ScrubRound:
        scrubbed = corrupt = 0
        started = self.clock()
        try:
            records = await self.registry.by_state(CheckpointState.VALID)
            for record in domain.scrub_order(records, self.resume_after):
                if limit_s is not None and self.clock() - started >= timedelta(seconds=limit_s):
                    return self._paused(scrubbed, corrupt, limit_s)
                found = await self._scrub(record, records)
                self.resume_after = record.checkpoint_id
                if found is None:
                    continue
                scrubbed += 1
                corrupt += found
        except TransientError as exc:
            return self._interrupted(scrubbed, corrupt, f"registry unavailable: {exc}")
        except StorageError as exc:
            if not exc.transient:
                raise
            return self._interrupted(scrubbed, corrupt, f"storage unavailable: {exc}")
        self.resume_after = None
        self.left_to_watcher &= {record.checkpoint_id for record in records}  # decided since
        self.metrics.last_round.labels(self.metrics.service).set(self.clock().timestamp())
        return ScrubRound(scrubbed, corrupt, complete=True)

    def _interrupted(self, scrubbed: int, corrupt: int, why: str) -> ScrubRound:
        log.warning("scrub round stopped after %d checkpoints, continuing next round: %s",
                    scrubbed, why)  # fmt: skip
        self.metrics.interrupted.labels(self.metrics.service).inc()
        return ScrubRound(scrubbed, corrupt, complete=False, resume_after=self.resume_after)

    def _paused(self, scrubbed: int, corrupt: int, limit_s: float) -> ScrubRound:
        rate = f"{self.budget.bytes_per_s / 2**20:g} MiB/s" if self.budget.limited else "no limit"
        log.warning("scrub round reached its %gs limit after %d checkpoints at its read budget "
                    "(%s); the next round continues after %s", limit_s, scrubbed, rate,
                    self.resume_after)  # fmt: skip
        self.metrics.paused.labels(self.metrics.service).inc()
        return ScrubRound(
            scrubbed, corrupt, complete=False, resume_after=self.resume_after, paused=True
        )

    async def _scrub(
        self, record: CheckpointRecord, valid: Sequence[CheckpointRecord] = ()
    ) -> int | None:
        """1 if found corrupt (and reported), 0 if intact, None if not this store's or not at a
        location its job owns (never read: a record registered before ownership was checked),
        or gone as a whole while a newer checkpoint of its job is on storage (`_rotated`;
        ``valid``: the round's valid records)."""
        if key_for_uri(self.store, record.uri) is None:
            return None
        try:
            key = owned_key(self.store, record.job_id, record.checkpoint_id, record.uri)
        except LocationNotOwned as exc:
            log.warning("scrub: not reading %s: %s", record.checkpoint_id, exc)
            return None
        with tracing.span(
            "scrub.verify",
            attributes={"ckpt_ha.checkpoint_id": record.checkpoint_id, "ckpt_ha.storage_key": key},
        ):
            # The time the budget makes the reads wait is not a hung mount: it extends the bound.
            extra_s = self.budget.seconds_for(record.total_bytes or 0)
            if await bounded.call(_gone, self.store, key) and await self._rotated(record, valid):
                # Removed as a whole, a newer one of its job still there: its writer's rotation,
                # which the writer-watcher records (a tombstone, the job as actor); condemning it
                # here would page for nothing. The job's newest gone too is a loss: condemned.
                # Still valid when a later pass finds it gone again: the watcher did not record
                # it as a rotation (its newer one came after, from a job restored after a loss):
                # a loss too.
                if record.checkpoint_id not in self.left_to_watcher:
                    self.left_to_watcher.add(record.checkpoint_id)
                    log.info("scrub: %s is gone as a whole: left to the writer-watcher", key)
                    return None
                log.warning("scrub: %s is gone and still valid a pass later: lost", key)
            self.left_to_watcher.discard(record.checkpoint_id)
            report = await bounded.call(_reverify, self.reads, key, self.algorithm, extra_s=extra_s)
        self.metrics.scrubbed.labels(self.metrics.service).inc()
        datas = domain.scrub_outcome(
            job_id=record.job_id,
            checkpoint_id=record.checkpoint_id,
            uri=record.uri,
            recorded=record.checksums,
            report=report,
            copies=record.copies,
        )
        if self.copies is not None and record.copies:
            failed = await self.copies.check_copies(record, primary_ok=not datas)
            if datas and failed:  # what is left to restore from, for the primary's verdict
                datas = domain.scrub_outcome(
                    job_id=record.job_id,
                    checkpoint_id=record.checkpoint_id,
                    uri=record.uri,
                    recorded=record.checksums,
                    report=report,
                    copies=domain.without(record.copies, failed),
                )
        if not datas:
            return 0
        current = await self.registry.get(record.checkpoint_id)
        if not domain.still_scrubbed(current):
            return 0
        log.warning("scrub: %s is corrupt: %s", record.checkpoint_id, datas[0])
        cause = domain.scrub_key(record)
        # Reported in the checkpoint's own trace (stored by the registry), linked to this round.
        with tracing.continue_trace(
            "scrub.corrupt",
            record.traceparent,
            tracestate=record.tracestate,
            attributes={
                "ckpt_ha.checkpoint_id": record.checkpoint_id,
                "ckpt_ha.job_id": record.job_id,
            },
        ):
            reason = getattr(datas[0], "reason", "scrub found the checkpoint corrupt")
            tracing.fail(str(reason), code="checkpoint_corrupt")
            for data in await isolate(self.store, datas, self.registry):
                await self.publisher.publish(
                    build(data, source=SOURCE, time=self.clock(), key=cause)
                )
        self.metrics.corrupt.labels(self.metrics.service).inc()
        return 1

    async def _rotated(self, record: CheckpointRecord, valid: Sequence[CheckpointRecord]) -> bool:
        """``record``, gone as a whole, is not a loss (`ckpt_ha.core.rotation`): a newer
        checkpoint of its job, valid or still being verified or written, is on this storage."""
        gone = (record.step, record.created_at)
        committed: list[Order] = []
        writing: list[Order] = []
        later = [
            *(r for r in valid if r.checkpoint_id != record.checkpoint_id),
            *await self.registry.by_state(CheckpointState.PENDING_VERIFICATION),
            *await self.registry.by_state(CheckpointState.WRITING),
        ]
        for other in later:
            if other.job_id != record.job_id or not newer((other.step, other.created_at), gone):
                continue
            key = key_for_uri(self.store, other.uri)
            if key is None or await bounded.call(_gone, self.store, key):
                continue
            side = committed if other.state is CheckpointState.VALID else writing
            side.append((other.step, other.created_at))
        return removal_of(gone, committed, writing) is not Removal.LOSS

    async def run(self, interval_s: float) -> None:
        """A round every ``interval_s``, each limited to ``interval_s``; a round that reached
        its limit (behind at its budget) is followed at once by the next, which continues it."""
        delay = interval_s
        while True:
            await next_round(delay)
            delay = interval_s
            try:
                result = await self.scrub_once(limit_s=interval_s)
            except Exception:  # a scrub must never stop for good: log and try next round
                log.exception("scrub round failed")
                continue
            if result.paused:
                delay = 0.0


def _reverify(store: ObjectStore, key: str, algorithm: str) -> Report:
    """A scrub's verification: have the bytes changed since the checkpoint was verified? Whether
    its manifest holds every declared rank was decided then (`formats.native.missing_ranks`)."""
    return verify(store, key, algorithm, ranks=False)


def _gone(store: ObjectStore, key: str) -> bool:
    """Nothing left at ``key``: no file of that name, nothing under it as a folder."""
    if next(iter(store.list(f"{key}/")), None) is not None:
        return False
    try:
        store.stat(key)
    except ObjectNotFound:
        return True
    return False
