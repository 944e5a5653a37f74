"""A job's restore history, as on-call reads it: every plan with its reasons, every escalation
with the differences or stop condition behind it and the runbook's next step, every load
outcome and continuity verdict. Pure: it formats events read from the stream (the stream, not
Redis, is where every decision is recorded)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckpt_ha.contracts import Envelope, EventData
from ckpt_ha.contracts.resume import (
    ResumeClosedV1,
    ResumeDivergedV1,
    ResumeEscalatedV2,
    ResumeLoadedV1,
    ResumeLoadFailedV2,
    ResumePlannedV2,
    ResumeVerifiedV1,
)


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: str
    plan_id: str
    summary: str
    details: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "kind": self.kind,
            "plan_id": self.plan_id,
            "summary": self.summary,
            "details": list(self.details),
        }


def escalation_details(detail: str, next_step: str) -> tuple[str, ...]:
    """An escalation's detail one finding per line (a compatibility escalation lists each
    difference after a colon, separated by ``; ``), then the next step."""
    head, sep, rest = detail.partition(": ")
    parts = [p for p in rest.split("; ") if p] if sep else []
    lines = [head + ":", *(f"  {p}" for p in parts)] if parts else [detail]
    return (*lines, f"next step: {next_step}")


def _entry(event: Envelope[EventData]) -> Entry | None:
    d = event.data
    at, kind = event.time, d.EVENT_TYPE.removeprefix("resume.")
    if isinstance(d, ResumePlannedV2):
        summary = (
            f"attempt {d.attempt} to restore {d.checkpoint_id} at step {d.step} "
            f"({d.mode.value}, compatibility {d.compatibility.value})"
        )
        details = [*d.reasons, f"recompute: {d.recompute_steps} steps, {d.recompute_seconds:g} s"]
        if d.fallback_from:
            details.append(f"fallback after {d.fallback_from} failed to load")
        return Entry(at, kind, d.plan_id, summary, tuple(details))
    if isinstance(d, ResumeEscalatedV2):
        return Entry(at, kind, d.plan_id, f"automatic restore stopped: {d.reason}",
                     escalation_details(d.detail, d.next_step))  # fmt: skip
    if isinstance(d, ResumeLoadFailedV2):
        rank = f" on rank {d.rank}" if d.rank is not None else ""
        summary = f"{d.checkpoint_id} failed to load{rank} (blames the {d.blame.value})"
        return Entry(at, kind, d.plan_id, summary, (d.reason,))
    if isinstance(d, ResumeLoadedV1):
        took = f" in {d.load_seconds:g} s" if d.load_seconds is not None else ""
        return Entry(at, kind, d.plan_id, f"{d.checkpoint_id} loaded at step {d.step}{took}")
    if isinstance(d, ResumeVerifiedV1 | ResumeDivergedV1):
        lines = tuple(
            f"{c.name}: expected {c.expected}, observed {c.observed} ({'ok' if c.ok else 'NOT ok'})"
            for c in d.comparisons
        )
        word = "continued as before" if isinstance(d, ResumeVerifiedV1) else "diverged"
        return Entry(at, kind, d.plan_id, f"{word} at step {d.step}", lines)
    if isinstance(d, ResumeClosedV1):
        lines = (*(f"cleaned {u}" for u in d.cleaned), *(f"left {u}" for u in d.unreclaimable))
        return Entry(at, kind, d.plan_id, "closed", lines)
    return None


def history(events: Iterable[Envelope[EventData]]) -> list[Entry]:
    """The job's resume.* events in stream order, each as one entry."""
    return [e for e in (_entry(ev) for ev in events) if e is not None]
