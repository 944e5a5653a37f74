"""R9: when automatic restores stop: restart loops, the same failure repeating, fallbacks
exhausted, storage faults growing; an escalation names the runbook's next step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from ckpt_ha.contracts.job import JobPolicy
from ckpt_ha.restore_coordinator.records import History

RUNBOOK = "docs/RUNBOOK.md"
"""Where escalations point: each next step is an anchor of this file's step sections."""


class Stop(StrEnum):
    """Escalation reasons, each with the runbook step a human takes next."""

    RESTART_LOOP = "restart_loop"
    SAME_FAILURE = "same_failure_repeating"
    FALLBACKS_EXHAUSTED = "fallbacks_exhausted"
    STORAGE_ERRORS = "storage_errors_growing"
    COMPATIBILITY_UNKNOWN = "compatibility_unknown"
    NO_VALID_CHECKPOINT = "no_valid_checkpoint"
    UNRECLAIMABLE = "unreclaimable_leftovers"
    CANNOT_LOAD = "attempt_cannot_load"
    """A resumed attempt could not load a valid checkpoint for a reason that blames the attempt
    (unsupported format, missing dependency, environment): the checkpoint stays valid."""


NEXT_STEPS: Mapping[Stop, str] = {
    Stop.RESTART_LOOP: f"{RUNBOOK}#stop-runaway-retries: stop runaway retries",
    Stop.SAME_FAILURE: f"{RUNBOOK}#stop-runaway-retries: stop runaway retries",
    Stop.FALLBACKS_EXHAUSTED: f"{RUNBOOK}#choose-rollback-version: choose a rollback version",
    Stop.STORAGE_ERRORS: f"{RUNBOOK}#check-storage: check storage before any restore",
    Stop.COMPATIBILITY_UNKNOWN: f"{RUNBOOK}#prepare-environment: prepare the restore environment",
    Stop.NO_VALID_CHECKPOINT: f"{RUNBOOK}#choose-rollback-version: choose a rollback version",
    Stop.UNRECLAIMABLE: f"{RUNBOOK}#reclaim-leftovers: reclaim leftovers by hand",
    Stop.CANNOT_LOAD: f"{RUNBOOK}#prepare-environment: prepare the restore environment",
}


@dataclass(frozen=True)
class Escalation:
    reason: Stop
    detail: str

    @property
    def next_step(self) -> str:
        return NEXT_STEPS[self.reason]


def stop_reason(
    history: History, policy: JobPolicy, now: datetime, *, load_failed: bool = False
) -> Escalation | None:
    """R9: None to go on restoring, else why to stop. Checked before every plan."""
    since = now.timestamp() - policy.restart_window_s
    recent = [t for t in history.restarts if t.timestamp() >= since]
    if len(recent) >= policy.max_restarts:
        return Escalation(
            Stop.RESTART_LOOP,
            f"{len(recent)} automatic restores within {policy.restart_window_s:g}s "
            f"(max_restarts {policy.max_restarts})",
        )
    same = 0
    last = history.failures[-1].signature if history.failures else None
    if last is not None:
        for f in reversed(history.failures):
            if f.signature != last:
                break
            same += 1
    if same >= policy.max_same_failure:
        return Escalation(
            Stop.SAME_FAILURE,
            f"failure {last} repeated {same} times in a row (max_same_failure "
            f"{policy.max_same_failure})",
        )
    storage = [t for t in history.storage_errors if t.timestamp() >= since]
    if len(storage) >= policy.max_storage_errors:
        return Escalation(
            Stop.STORAGE_ERRORS,
            f"{len(storage)} storage-side failures within {policy.restart_window_s:g}s "
            f"(max_storage_errors {policy.max_storage_errors})",
        )
    if load_failed and history.fallbacks >= policy.max_fallbacks:
        return Escalation(
            Stop.FALLBACKS_EXHAUSTED,
            f"{history.fallbacks + 1} checkpoints failed to load (max_fallbacks "
            f"{policy.max_fallbacks})",
        )
    return None
