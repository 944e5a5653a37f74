"""Integrity-checker handlers: verify a committed checkpoint on storage, publish the verdict.

Fetch (the registry's record, the bytes) → decide (`domain`) → persist (move a corrupt
checkpoint's bytes aside) → publish. Every dependency is a port (`integrity_checker.ports`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import cast

from ckpt_ha.contracts import Envelope, EventData, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointCorruptV1,
    CheckpointReleasedV1,
    CheckpointState,
)
from ckpt_ha.core.errors import DependencyNotReady, PermanentError
from ckpt_ha.core.locations import LocationNotOwned, plan_removal
from ckpt_ha.core.records import CheckpointRecord, job_mismatch
from ckpt_ha.formats import verify
from ckpt_ha.formats.report import Report
from ckpt_ha.integrity_checker import domain
from ckpt_ha.integrity_checker.metrics import VerifyMetrics
from ckpt_ha.integrity_checker.ports import CheckerRegistry, Clock, ObjectStore, Publisher
from ckpt_ha.storage import bounded, key_for_uri
from ckpt_ha.storage.owned import job_neighbours, owned_key, owned_quarantine_key
from ckpt_ha.storage.quarantine import quarantine_key, restore
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.telemetry import tracing

SOURCE = "ckpt-ha/integrity-checker"
log = logging.getLogger("ckpt_ha.integrity_checker")


class OutsideStorageRoot(PermanentError):
    code = "outside_storage_root"

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(f"{uri} is not under this checker's storage root")


class IntegrityHandlers:
    def __init__(
        self,
        store: ObjectStore,
        publisher: Publisher,
        clock: Clock,
        algorithm: str,
        registry: CheckerRegistry,
        metrics: VerifyMetrics | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.clock = clock
        self.algorithm = algorithm
        self.registry = registry
        self.metrics = metrics

    async def on_commits(self, batch: list[Envelope[EventData]]) -> list[BaseException | None]:
        """A fetched batch of commits: their records read in one round trip, then each commit
        verified and its verdict published as `on_committed` does, the commits side by side
        (each checkpoint's verdict depends on its own bytes and record only; storage calls share
        the bounded pool). Returns each commit's own outcome, so one that fails (corrupt bytes
        are a verdict, not a failure; an outage, a refusal) is settled alone."""
        events = cast(Sequence[Envelope[CheckpointCommittedV1]], batch)  # the consumer's filter
        with tracing.span(
            "registry.get_many",
            attributes={"db.system": "redis", "ckpt_ha.batch_size": len(events)},
        ):
            records = await self.registry.get_many([e.data.checkpoint_id for e in events])
        return list(
            await asyncio.gather(
                *(self._commit(e, r) for e, r in zip(events, records, strict=True))
            )
        )

    async def _commit(
        self, event: Envelope[CheckpointCommittedV1], record: CheckpointRecord | None
    ) -> BaseException | None:
        """One commit of a batch, in its checkpoint's trace (the batch's span is its link)."""
        with tracing.continue_trace(
            f"integrity-checker {event.event_type}",
            event.traceparent,
            tracestate=event.tracestate,
            attributes=tracing.event_attributes(event),
            link_origin=False,
        ):
            try:
                await self._committed(event, record)
            except Exception as exc:  # noqa: BLE001 - this commit's own outcome
                tracing.annotate(**{"ckpt_ha.error": repr(exc)[:500]})
                return exc
            return None

    async def on_committed(self, event: Envelope[CheckpointCommittedV1]) -> None:
        """Verify a commit, only at a location its job owns and for a record (if any) of its
        job: anything else is refused unread (`LocationNotOwned`, `JobMismatch`)."""
        self._owned(event.data.job_id, event.data.checkpoint_id, event.data.uri)
        tracing.annotate(**tracing.event_attributes(event))
        with tracing.span("registry.get", attributes={"db.system": "redis"}):
            record = await self.registry.get(event.data.checkpoint_id)
        await self._committed(event, record)

    async def _committed(
        self, event: Envelope[CheckpointCommittedV1], record: CheckpointRecord | None
    ) -> None:
        """`on_committed` once the record (if any) was read."""
        key = self._owned(event.data.job_id, event.data.checkpoint_id, event.data.uri)
        refused = job_mismatch(record, event.data)
        if refused is not None:
            raise refused
        if not domain.should_verify(record.state if record is not None else None):
            tracing.annotate(
                **{"ckpt_ha.decision": "skip", "ckpt_ha.state": record and record.state}
            )
            log.info("skip %s: already %s", event.data.checkpoint_id, record and record.state)
            return
        report = await self._verify(key)
        datas = await self._decide(domain.outcome(event.data, report))
        verdict = domain.verdict_key(event.data.checkpoint_id, event.id, released=False)
        await self.publisher.publish_caused_by(
            event, datas, source=SOURCE, time=self.clock(), key=verdict
        )

    def _owned(self, job_id: str, checkpoint_id: str, uri: str) -> str:
        if key_for_uri(self.store, uri) is None:
            raise OutsideStorageRoot(uri)
        return owned_key(self.store, job_id, checkpoint_id, uri)

    async def _verify(self, key: str) -> Report:
        """Read the shards and check them: blocking I/O, off the event loop (in-progress acks
        keep flowing); one span for the storage reads and checksum work."""
        with tracing.span(
            "checkpoint.verify",
            attributes={"ckpt_ha.storage_key": key, "ckpt_ha.checksum": self.algorithm},
        ) as current:
            started = time.perf_counter()
            report = await bounded.call(verify, self.store, key, self.algorithm)
            if self.metrics is not None:
                self.metrics.observe(
                    report.format, report.verdict, time.perf_counter() - started, report.bytes_read
                )
            if current.is_recording():
                current.set_attributes(
                    {
                        "ckpt_ha.format": report.format.value,
                        "ckpt_ha.verdict": report.verdict.value,
                        "ckpt_ha.bytes_read": report.bytes_read,
                        "ckpt_ha.files": len(report.checksums),
                    }
                )
        return report

    async def _decide(self, decided: list[EventData]) -> list[EventData]:
        """The verdict on the span: a corrupt checkpoint marks it ERROR with the reason; a
        quarantine moves the bytes aside (storage writes) before the events go out."""
        corrupt = next((d for d in decided if isinstance(d, CheckpointCorruptV1)), None)
        if corrupt is not None:
            tracing.annotate(**{"ckpt_ha.decision": "corrupt", "ckpt_ha.side": corrupt.side})
            tracing.fail(corrupt.reason, code="checkpoint_corrupt")
        else:
            tracing.annotate(**{"ckpt_ha.decision": "verified"})
        with tracing.span("checkpoint.isolate"):
            return await isolate(self.store, decided, self.registry)

    async def on_released(self, event: Envelope[CheckpointReleasedV1]) -> None:
        """A human released a quarantined checkpoint: put its bytes back where they were written
        and verify it again. It is valid only if the checks pass this time.

        The bytes go back only to the record's own location, of the release's job, and only
        when no other live record's bytes are there (else they would be verified as this
        checkpoint's): anything else is refused (`JobMismatch`, `LocationNotOwned`)."""
        data = event.data
        self._owned(data.job_id, data.checkpoint_id, data.uri)
        record = await self.registry.get(data.checkpoint_id)
        refused = job_mismatch(record, event.data)
        if refused is not None:
            raise refused
        step = domain.release_decision(event.id, data, record)
        if step == "wait":
            raise DependencyNotReady(f"release of {data.checkpoint_id}", "the registrar")
        if step == "skip":
            log.info(
                "release of %s: nothing to do (%s)", data.checkpoint_id, record and record.state
            )
            return
        assert record is not None  # "verify" is decided only on the record this release moved
        key = await self._release_target(record)
        if data.quarantine_uri is not None:
            if key_for_uri(self.store, data.quarantine_uri) is None:
                raise OutsideStorageRoot(data.quarantine_uri)
            qkey = owned_quarantine_key(
                self.store, data.job_id, data.checkpoint_id, data.quarantine_uri
            )
            await bounded.call(restore, self.store, qkey, key)
        report = await self._verify(key)
        datas = await self._decide(domain.outcome(data, report))
        await self.publisher.publish_caused_by(event, datas, source=SOURCE, time=self.clock())

    async def reverify(self, overdue: domain.Overdue) -> bool:
        """Verify again a checkpoint whose verdict never reached the registry, and publish the
        verdict under the id the lost one had (derived from ``overdue.cause``), so the registry
        applies it once however often it is re-driven. A release's bytes come back from
        quarantine first, as `on_released` does. True when a verdict was published; False when
        the record moved on meanwhile. Raises what the live handlers raise (a storage or
        registry outage is retried next round)."""
        record = await self.registry.get(overdue.checkpoint_id)
        if record is None or record.state is not CheckpointState.PENDING_VERIFICATION:
            return False
        with tracing.continue_trace(
            "reconcile.verify",
            record.traceparent,
            tracestate=record.tracestate,
            attributes={
                "ckpt_ha.checkpoint_id": record.checkpoint_id,
                "ckpt_ha.job_id": record.job_id,
                "ckpt_ha.since": overdue.since.isoformat(),
            },
        ):
            if overdue.released:
                key = await self._release_target(record)
                qkey = quarantine_key(record.job_id, record.checkpoint_id)
                await bounded.call(restore, self.store, qkey, key)
            else:
                key = self._owned(record.job_id, record.checkpoint_id, record.uri)
            report = await self._verify(key)
            datas = await self._decide(domain.outcome(record, report))
            verdict = domain.verdict_key(
                overdue.checkpoint_id, overdue.cause, released=overdue.released
            )
            for data in datas:  # each a child of this span, in the checkpoint's trace
                await self.publisher.publish(
                    build(data, source=SOURCE, time=self.clock(), key=verdict)
                )
        return True

    async def _release_target(self, record: CheckpointRecord) -> str:
        """Where a released checkpoint's bytes go back: its own location, if no other live
        record of its job has bytes there, around it or inside it."""
        key = self._owned(record.job_id, record.checkpoint_id, record.uri)
        others = await job_neighbours(
            self.store, self.registry, record.job_id, [record.checkpoint_id]
        )
        removal = plan_removal(key, others)
        if not removal.whole:
            raise LocationNotOwned(record.job_id, record.checkpoint_id, record.uri, removal.note())
        return key
