"""The reconciler of verification: no checkpoint stays pending verification for good.

A `committed` is verified once, when its event is delivered; a storage or registry outage
longer than the retry budget (``max_deliver`` deliveries, backoff 1, 5, 15, 30 s) dead-letters
that delivery, and a registry outage can do the same to the registrar's delivery of the
verdict. Either way the registry holds the checkpoint as ``pending_verification`` and nothing
would ever move it. The integrity-checker owns that step, so it also owns its re-drive: each
round reads the registry's state index for pending checkpoints on its storage root, and every
one pending for longer than the deadline (``CKPT_HA_VERIFY_DEADLINE_S``) is verified again
(`IntegrityHandlers.reverify`) once storage and the registry answer. The verdict has the id the
lost one had, so running a round twice, or alongside a replay of the dead letter, moves the
checkpoint once. An outage ends the round early and the next round retries; nothing is decided
from an outage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.errors import PermanentError, TransientError
from ckpt_ha.integrity_checker import domain
from ckpt_ha.integrity_checker.handlers import IntegrityHandlers
from ckpt_ha.integrity_checker.ports import CheckpointReader, Clock, ObjectStore
from ckpt_ha.runtime.leader import next_round
from ckpt_ha.storage import StorageError, key_for_uri
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import ReconcileMetrics

log = logging.getLogger("ckpt_ha.integrity_checker.reconcile")

STATE = CheckpointState.PENDING_VERIFICATION


@dataclass(frozen=True)
class ReconcileRound:
    stuck: int
    """Pending verification past the deadline when the round started."""
    redriven: int
    """Verified again, and the verdict published."""
    complete: bool
    """False when an outage cut the round short."""


class Reconciler:
    def __init__(
        self,
        store: ObjectStore,
        registry: CheckpointReader,
        handlers: IntegrityHandlers,
        clock: Clock,
        deadline: timedelta,
        metrics: ReconcileMetrics,
    ) -> None:
        self.store = store
        self.registry = registry
        self.handlers = handlers
        self.clock = clock
        self.deadline = deadline
        self.metrics = metrics

    async def reconcile_once(self) -> ReconcileRound:
        with tracing.span("reconcile.round", attributes={"ckpt_ha.state": STATE.value}) as span:
            result = await self._round()
            span.set_attributes(
                {
                    "ckpt_ha.stuck": result.stuck,
                    "ckpt_ha.redriven": result.redriven,
                    "ckpt_ha.complete": result.complete,
                }
            )
            return result

    async def _round(self) -> ReconcileRound:
        redriven = 0
        overdue: list[domain.Overdue] = []
        try:
            now = self.clock()
            for record in await self.registry.by_state(STATE):
                if key_for_uri(self.store, record.uri) is None:
                    continue  # another checker's storage root
                found = domain.overdue_verification(record, now, self.deadline)
                if found is not None:
                    overdue.append(found)
            for found in overdue:
                redriven += await self._redrive(found)
        except TransientError as exc:
            return self._interrupted(len(overdue), redriven, f"registry unavailable: {exc}")
        except StorageError as exc:
            if not exc.transient:
                raise
            return self._interrupted(len(overdue), redriven, f"storage unavailable: {exc}")
        self.metrics.round(STATE.value, len(overdue), redriven, self.clock().timestamp())
        return ReconcileRound(len(overdue), redriven, complete=True)

    async def _redrive(self, overdue: domain.Overdue) -> int:
        log.warning(
            "re-driving %s: pending verification since %s (verdict lost)",
            overdue.checkpoint_id,
            overdue.since.isoformat(),
        )
        try:
            return int(await self.handlers.reverify(overdue))
        except PermanentError as exc:
            # Refused as the live handler would refuse it (not this job's location, another
            # record's bytes): left for a human, and counted as stuck until one decides.
            log.warning("cannot re-drive %s: %s", overdue.checkpoint_id, exc)
            return 0

    def _interrupted(self, stuck: int, redriven: int, why: str) -> ReconcileRound:
        log.warning("reconcile round stopped after %d re-drives, retrying next round: %s",
                    redriven, why)  # fmt: skip
        self.metrics.interrupted.labels(self.metrics.service).inc()
        if redriven:
            self.metrics.redriven.labels(self.metrics.service, STATE.value).inc(redriven)
        return ReconcileRound(stuck, redriven, complete=False)

    async def run(self, interval_s: float) -> None:
        """A round at start (a restarted checker picks up what it missed), then every
        ``interval_s``."""
        while True:
            try:
                await self.reconcile_once()
            except Exception:  # the reconciler must never stop for good: log, try next round
                log.exception("reconcile round failed")
            await next_round(interval_s)
