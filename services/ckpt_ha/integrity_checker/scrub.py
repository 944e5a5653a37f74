"""The periodic scrub: re-verify every valid checkpoint against what was recorded at verification.

Bytes rot, disks fail, someone overwrites a shard in place: a checkpoint verified last week is not
necessarily intact today (R7: evidence per level, never assumed). Each round re-reads every VALID
checkpoint the registry holds, compares the checksums with those its `verified` event recorded,
and reports a mismatch, a missing file or a failed verdict as `corrupt` + `quarantined`, moving
the bytes aside first. A storage or registry outage ends the round early and is retried next
round; it is never reported as corruption.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ckpt_ha.contracts import build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.locations import LocationNotOwned
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import verify
from ckpt_ha.integrity_checker import domain
from ckpt_ha.integrity_checker.ports import CheckpointReader, Clock, ObjectStore, Publisher
from ckpt_ha.storage import StorageError, bounded, key_for_uri
from ckpt_ha.storage.owned import owned_key
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import ScrubMetrics

SOURCE = "ckpt-ha/integrity-checker"
log = logging.getLogger("ckpt_ha.integrity_checker.scrub")


@dataclass(frozen=True)
class ScrubRound:
    scrubbed: int
    corrupt: int
    complete: bool
    """False when an outage cut the round short."""


class Scrubber:
    def __init__(
        self,
        store: ObjectStore,
        registry: CheckpointReader,
        publisher: Publisher,
        clock: Clock,
        algorithm: str,
        metrics: ScrubMetrics,
    ) -> None:
        self.store = store
        self.registry = registry
        self.publisher = publisher
        self.clock = clock
        self.algorithm = algorithm
        self.metrics = metrics

    async def scrub_once(self) -> ScrubRound:
        """One round, traced as a trace of its own; a corruption it finds is reported in the
        checkpoint's own trace (from the registry) with a link back to the round."""
        with tracing.span("scrub.round") as current:
            result = await self._round()
            current.set_attributes(
                {
                    "ckpt_ha.scrubbed": result.scrubbed,
                    "ckpt_ha.corrupt": result.corrupt,
                    "ckpt_ha.complete": result.complete,
                }
            )
            return result

    async def _round(self) -> ScrubRound:
        scrubbed = corrupt = 0
        try:
            for record in await self.registry.by_state(CheckpointState.VALID):
                found = await self._scrub(record)
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
        self.metrics.last_round.labels(self.metrics.service).set(self.clock().timestamp())
        return ScrubRound(scrubbed, corrupt, complete=True)

    def _interrupted(self, scrubbed: int, corrupt: int, why: str) -> ScrubRound:
        log.warning("scrub round stopped after %d checkpoints, retrying next round: %s",
                    scrubbed, why)  # fmt: skip
        self.metrics.interrupted.labels(self.metrics.service).inc()
        return ScrubRound(scrubbed, corrupt, complete=False)

    async def _scrub(self, record: CheckpointRecord) -> int | None:
        """1 if found corrupt (and reported), 0 if intact, None if not this store's or not at a
        location its job owns (never read: a record registered before ownership was checked)."""
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
            report = await bounded.call(verify, self.store, key, self.algorithm)
        self.metrics.scrubbed.labels(self.metrics.service).inc()
        datas = domain.scrub_outcome(
            job_id=record.job_id,
            checkpoint_id=record.checkpoint_id,
            uri=record.uri,
            recorded=record.checksums,
            report=report,
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

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.scrub_once()
            except Exception:  # a scrub must never stop for good: log and try next round
                log.exception("scrub round failed")
