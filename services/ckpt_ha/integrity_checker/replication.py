"""Copies of valid checkpoints on replicas, for the tiers that replicate (R13).

One loop under its lease (``replicate``): each round reads the valid checkpoints, finds those
whose job's tier replicates to a configured root and that lack a valid copy there
(`copies.needs_copy`), and for each one announces ``copying``, streams its files to the same key
under the replica root (`storage.transfer.copy_folder`, bounded memory, reads held to the copy
budget ``copy_bytes_per_s``), verifies the copy against the checksums recorded when the
checkpoint was verified, and announces ``valid`` (or ``corrupt``). A copy cut short (the process
killed, storage down) stays ``copying`` in the registry: never restored from, and the next round
resumes it (objects already there with their size are not written again; the verification then
covers them, and a copy that fails it is written again in full once before it is reported
corrupt). A copy reported corrupt or missing is copied again from the primary the same way.
When the checkpoint is deleted (``checkpoint.deleted``) every copy is removed from its replica
and announced ``deleted`` (`on_deleted`); a copy finished after that is removed, never valid.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_ha.contracts import Envelope, build
from ckpt_ha.contracts.checkpoint import (
    CheckpointCopyChangedV1,
    CheckpointDeletedV1,
    CheckpointState,
    CopyState,
)
from ckpt_ha.core.copies import live_copies, valid_copies
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.locations import LocationNotOwned
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.core.tiers import TIERS, Tier
from ckpt_ha.formats import verify
from ckpt_ha.integrity_checker import copies
from ckpt_ha.integrity_checker.domain import ALL_COPIES_LOST, scrub_findings
from ckpt_ha.integrity_checker.metrics import CopyMetrics
from ckpt_ha.integrity_checker.ports import Clock, CopyRegistry, ObjectStore, Publisher
from ckpt_ha.runtime.leader import next_round
from ckpt_ha.storage import StorageError, bounded, key_for_uri, open_store
from ckpt_ha.storage.owned import owned_key
from ckpt_ha.storage.read_budget import BudgetedStore, ReadBudget
from ckpt_ha.storage.transfer import copy_folder, remove_folder
from ckpt_ha.telemetry import tracing

SOURCE = "ckpt-ha/integrity-checker"
log = logging.getLogger("ckpt_ha.integrity_checker.replication")


@dataclass(frozen=True)
class CopyRound:
    copied: int
    failed: int
    waiting: int
    """Valid checkpoints that still lacked a valid copy when the round began."""
    complete: bool


class Replicator:
    def __init__(
        self,
        store: ObjectStore,
        registry: CopyRegistry,
        publisher: Publisher,
        clock: Clock,
        algorithm: str,
        metrics: CopyMetrics,
        roots: Mapping[str, str],
        budget: ReadBudget | None = None,
        replicas: Mapping[str, ObjectStore] | None = None,
    ) -> None:
        """``roots``: tier → replica root; ``replicas``: the stores of those roots (opened from
        the roots when not given)."""
        self.store = store
        self.registry = registry
        self.publisher = publisher
        self.clock = clock
        self.algorithm = algorithm
        self.metrics = metrics
        self.roots = dict(roots)
        self.budget = budget or ReadBudget(0, on_read=metrics.read, on_wait=metrics.waited)
        self.replicas = dict(replicas or {})
        for name in self.roots:
            if name in TIERS and TIERS[name].replicate:
                self.metrics.rpo.labels(metrics.service, name).set(TIERS[name].copy_rpo_s)
                self.metrics.lag.labels(metrics.service, name).set(0.0)

    def replica(self, root: str) -> ObjectStore:
        if root not in self.replicas:
            self.replicas[root] = open_store(root)
        return self.replicas[root]

    async def copy_once(self) -> CopyRound:
        with tracing.span("replicate.round") as current:
            result = await self._round()
            current.set_attributes(
                {"ckpt_ha.copied": result.copied, "ckpt_ha.waiting": result.waiting}
            )
            return result

    async def _round(self) -> CopyRound:
        copied = failed = 0
        try:
            due = await self._due()
        except TransientError as exc:
            log.warning("copy round skipped: registry unavailable: %s", exc)
            return CopyRound(0, 0, 0, complete=False)
        self._lag(due)
        for record, tier, root, key in due:
            try:
                outcome = await self._copy(record, tier, root, key)
            except (TransientError, StorageError) as exc:
                if isinstance(exc, StorageError) and not exc.transient:
                    raise
                log.warning("copy round stopped at %s, continuing next round: %s",
                            record.checkpoint_id, exc)  # fmt: skip
                self.metrics.interrupted.labels(self.metrics.service).inc()
                return CopyRound(copied, failed, len(due), complete=False)
            if outcome is CopyState.VALID:
                copied += 1
            elif outcome is not None:
                failed += 1
        if copied == len(due):
            self._lag([])
        return CopyRound(copied, failed, len(due), complete=True)

    def _lag(self, due: list[tuple[CheckpointRecord, Tier, str, str]]) -> None:
        """Replication lag per tier copied here, from what still lacks its copy."""
        now = self.clock()
        for name in self.roots:
            waiting = [record for record, tier, *_ in due if tier.name == name]
            self.metrics.lag.labels(self.metrics.service, name).set(
                copies.lag_seconds(waiting, now)
            )

    async def _due(self) -> list[tuple[CheckpointRecord, Tier, str, str]]:
        """The valid checkpoints lacking a valid copy, oldest first, with their tier, replica
        root and key."""
        tiers: dict[str, Tier] = {}
        due: list[tuple[CheckpointRecord, Tier, str, str]] = []
        records = await self.registry.by_state(CheckpointState.VALID)
        for record in sorted(records, key=lambda r: (r.created_at, r.checkpoint_id)):
            if record.job_id not in tiers:
                tiers[record.job_id] = (await self.registry.tier_of(record.job_id)).tier
            tier = tiers[record.job_id]
            root = copies.replica_root(tier, self.roots)
            if root is None or key_for_uri(self.store, record.uri) is None:
                continue
            try:
                key = owned_key(self.store, record.job_id, record.checkpoint_id, record.uri)
            except LocationNotOwned as exc:
                log.warning("copy: not reading %s: %s", record.checkpoint_id, exc)
                continue
            if copies.needs_copy(record, self.replica(root).uri(key)):
                due.append((record, tier, root, key))
        return due

    async def _copy(
        self, record: CheckpointRecord, tier: Tier, root: str, key: str
    ) -> CopyState | None:
        replica = self.replica(root)
        copy_uri = replica.uri(key)
        current = record.copies.get(copy_uri)
        if current is None or current.state is not CopyState.COPYING:
            start = copies.copying(record, copy_uri, tier.name)
            await self._publish(record, copy_uri, "copying", start)
        reads = BudgetedStore(self.store, self.budget)
        checks = BudgetedStore(replica, self.budget)
        # Time the budget makes the reads wait is not a hung mount: it extends the bound.
        extra_s = 2 * self.budget.seconds_for(record.total_bytes or 0)
        with tracing.span(
            "replicate.copy",
            attributes={"ckpt_ha.checkpoint_id": record.checkpoint_id, "ckpt_ha.copy": copy_uri},
        ):
            send = functools.partial(copy_folder, last=copies.commit_evidence)
            done = await bounded.call(send, reads, replica, key, extra_s=extra_s)
            written = done.bytes_written
            report = await bounded.call(verify, checks, key, self.algorithm, extra_s=extra_s)
            outcome = copies.copy_outcome(record, copy_uri, tier.name, report, written)
            if outcome.copy_state is not CopyState.VALID and done.written < done.objects:
                # A resumed copy kept objects already there: write every one again, once.
                resend = functools.partial(send, skip_same_size=False)
                again = await bounded.call(resend, reads, replica, key, extra_s=extra_s)
                written += again.bytes_written
                report = await bounded.call(verify, checks, key, self.algorithm, extra_s=extra_s)
                outcome = copies.copy_outcome(record, copy_uri, tier.name, report, written)
        self.metrics.bytes.labels(self.metrics.service).inc(written)
        now = await self.registry.get(record.checkpoint_id)
        if now is None or now.state is CheckpointState.DELETED:
            # Deleted while it was copied: the copy goes as well, never recorded valid.
            await self._remove_copy(record, copy_uri, "checkpoint deleted while it was copied")
            return None
        self.metrics.copies.labels(self.metrics.service, outcome.copy_state.value).inc()
        if outcome.copy_state is not CopyState.VALID:
            log.warning("copy of %s to %s failed verification: %s",
                        record.checkpoint_id, copy_uri, outcome.reason)  # fmt: skip
        await self._publish(record, copy_uri, "verified", outcome)
        return outcome.copy_state

    def _replica_of(self, copy_uri: str) -> tuple[ObjectStore, str] | None:
        """The replica store holding ``copy_uri`` and its key there (None: under no root
        configured now)."""
        for root in dict.fromkeys(self.roots.values()):
            replica = self.replica(root)
            key = key_for_uri(replica, copy_uri)
            if key is not None:
                return replica, key
        return None

    async def check_copies(self, record: CheckpointRecord, *, primary_ok: bool) -> list[str]:
        """The scrub of a checkpoint's valid copies: each is verified on its replica against
        the checksums recorded at verification; one that fails is announced ``corrupt`` (or
        ``missing`` when nothing is left there), and the copy loop copies it again from the
        primary. When it was the last good one and the primary failed too (``primary_ok``
        False), the reason says ``all copies lost``. Returns the copies that failed."""
        failed: list[str] = []
        good = [c for c in valid_copies(record.copies) if c.uri != record.uri]
        for copy in good:
            found = self._replica_of(copy.uri)
            if found is None:
                continue  # its root is no longer configured here: nothing to read it with
            replica, key = found
            checks = BudgetedStore(replica, self.budget)
            extra_s = self.budget.seconds_for(record.total_bytes or 0)
            report = await bounded.call(verify, checks, key, self.algorithm, extra_s=extra_s)
            findings = scrub_findings(record.checksums, report)
            if not findings:
                continue
            gone = await bounded.call(_empty, replica, key)
            left = len(good) - len(failed) - 1 + (1 if primary_ok else 0)
            reason = f"scrub: {findings[0]}"
            if left == 0:
                reason = f"{ALL_COPIES_LOST}: {reason}"
                self.metrics.all_lost.labels(self.metrics.service).inc()
            data = CheckpointCopyChangedV1(
                job_id=record.job_id,
                checkpoint_id=record.checkpoint_id,
                uri=record.uri,
                copy_uri=copy.uri,
                copy_state=CopyState.MISSING if gone else CopyState.CORRUPT,
                reason=reason[:4000],
                tier=copy.tier,
            )
            log.warning("scrub: copy %s of %s is %s: %s", copy.uri, record.checkpoint_id,
                        data.copy_state.value, reason)  # fmt: skip
            await self._publish(record, copy.uri, "scrub", data)
            self.metrics.copies.labels(self.metrics.service, data.copy_state.value).inc()
            failed.append(copy.uri)
        return failed

    async def on_deleted(self, event: Envelope[CheckpointDeletedV1]) -> None:
        """Retention (or a human) deleted the checkpoint: every copy of it goes too. Each copy
        its record holds (but those already deleted) is removed from its replica and announced
        ``deleted``; only a location of the deleted checkpoint's own job is touched."""
        d = event.data
        record = await self.registry.get(d.checkpoint_id)
        if record is None or record.job_id != d.job_id:
            return
        for copy in live_copies(record.copies.values()):
            await self._remove_copy(record, copy.uri, f"checkpoint deleted: {d.reason}")

    async def _remove_copy(self, record: CheckpointRecord, copy_uri: str, why: str) -> None:
        found = self._replica_of(copy_uri)
        if found is None:
            log.warning("copy %s of deleted %s: under no configured replica root, not removed",
                        copy_uri, record.checkpoint_id)  # fmt: skip
            return
        replica, _ = found
        try:
            key = owned_key(replica, record.job_id, record.checkpoint_id, copy_uri)
        except LocationNotOwned as exc:
            log.warning("copy %s not removed: %s", copy_uri, exc)
            return
        removed = await bounded.call(remove_folder, replica, key)
        data = CheckpointCopyChangedV1(
            job_id=record.job_id,
            checkpoint_id=record.checkpoint_id,
            uri=record.uri,
            copy_uri=copy_uri,
            copy_state=CopyState.DELETED,
            reason=f"{why} ({removed} objects removed)"[:4000],
        )
        await self._publish(record, copy_uri, "deleted", data)

    async def _publish(
        self, record: CheckpointRecord, copy_uri: str, step: str, data: CheckpointCopyChangedV1
    ) -> None:
        key = copies.copy_key(record, copy_uri, step)
        await self.publisher.publish(build(data, source=SOURCE, time=self.clock(), key=key))

    async def run(self, interval_s: float) -> None:
        """A round every ``interval_s``; a round never stops the loop for good."""
        while True:
            await next_round(interval_s)
            try:
                await self.copy_once()
            except Exception:
                log.exception("copy round failed")


def _empty(store: ObjectStore, key: str) -> bool:
    """Nothing left under the folder ``key``."""
    return store.list_page(f"{key.rstrip('/')}/", page_size=1).items == ()
