"""Writer-watcher decisions, from what a storage listing shows. Pure: no I/O, no clock reads.

A checkpoint folder is ``<job>/<folder>/…`` under a storage root. Each scan gives, per folder,
the files it holds (path → size) and the newest modification time. From that alone:

* a folder seen for the first time, without complete commit evidence → `checkpoint.writing`;
* complete commit evidence (the format's marker file, and every file it lists present at its
  declared size, or at least that size where the format records only offset+length) →
  `checkpoint.committed`; a file appearing is never enough;
* no change for longer than the stall timeout while incomplete → `checkpoint.write_failed`
  (job-side: the writer stopped), and a shard that disappears after commit → write_failed too.

The checkpoint id comes from the folder and the time its first file was written, so a job that
is resubmitted and writes the same path again gets a new id and is never confused with the
earlier run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from contracts.checkpoint import (
    CheckpointCommittedV1,
    CheckpointFormat,
    CheckpointWriteFailedV1,
    CheckpointWritingV1,
    FailureSide,
)
from contracts.envelope import EventData
from services.shared.formats.identity import checkpoint_id


@dataclass(frozen=True)
class Evidence:
    """What the format's commit marker says must exist (path → size), or None if absent."""

    format: CheckpointFormat
    required: Mapping[str, int] | None
    step: int | None = None
    run_id: str | None = None
    at_least: frozenset[str] = frozenset()
    """Paths whose required size is a lower bound, not exact: formats such as DCP record
    offset+length of what each file must hold, never the file's size."""


@dataclass(frozen=True)
class Observation:
    folder: str
    """``<job>/<folder>`` relative to the storage root."""
    uri: str
    files: Mapping[str, int]
    first_written: datetime
    last_written: datetime
    evidence: Evidence


@dataclass(frozen=True)
class Tracked:
    checkpoint_id: str
    first_seen: datetime
    last_change: datetime
    signature: tuple[tuple[str, int], ...]
    phase: str = "new"
    """new → writing → committed | failed."""


@dataclass
class WatchState:
    folders: dict[str, Tracked] = field(default_factory=dict)


def missing(evidence: Evidence, files: Mapping[str, int]) -> list[str]:
    """Files the evidence requires that are absent, of another size, or short of a minimum."""
    if evidence.required is None:
        return ["commit marker"]
    gaps = []
    for path, size in sorted(evidence.required.items()):
        have = files.get(path)
        if path in evidence.at_least:
            if have is None or have < size:
                gaps.append(f"{path} (want at least {size} bytes, have {have or 'none'})")
        elif have != size:
            gaps.append(f"{path} (want {size} bytes, have {'none' if have is None else have})")
    return gaps


def observe(
    state: WatchState, seen: list[Observation], now: datetime, stall_after: timedelta
) -> list[EventData]:
    """Advance the watch state by one scan; return the events to publish, in order."""
    events: list[EventData] = []
    for obs in seen:
        job = obs.folder.split("/", 1)[0]
        signature = tuple(sorted(obs.files.items()))
        known = state.folders.get(obs.folder)
        cid = checkpoint_id(obs.folder, obs.first_written)
        if known is None or known.checkpoint_id != cid:  # new, or rewritten from scratch
            known = Tracked(cid, first_seen=now, last_change=now, signature=signature)
        elif known.signature != signature:
            known = replace(known, last_change=now, signature=signature)
        gaps = missing(obs.evidence, obs.files)
        if not gaps:
            if known.phase != "committed":
                events.append(
                    CheckpointCommittedV1(
                        job_id=job,
                        checkpoint_id=cid,
                        uri=obs.uri,
                        run_id=obs.evidence.run_id or "unknown",
                        step=obs.evidence.step or 0,
                        format=obs.evidence.format,
                        shard_count=len(obs.evidence.required or {}),
                        total_bytes=sum((obs.evidence.required or {}).values()),
                    )
                )
                known = replace(known, phase="committed")
        elif known.phase == "committed" and obs.evidence.required is not None:
            events.append(
                CheckpointWriteFailedV1(
                    job_id=job,
                    checkpoint_id=cid,
                    uri=obs.uri,
                    reason=f"files missing after commit: {gaps[:5]}",
                    side=FailureSide.JOB,
                )
            )
            known = replace(known, phase="failed")
        elif known.phase == "new":
            events.append(
                CheckpointWritingV1(
                    job_id=job,
                    checkpoint_id=cid,
                    uri=obs.uri,
                    run_id=obs.evidence.run_id or "unknown",
                    format=obs.evidence.format,
                )
            )
            known = replace(known, phase="writing")
        elif known.phase == "writing" and now - known.last_change > stall_after:
            events.append(
                CheckpointWriteFailedV1(
                    job_id=job,
                    checkpoint_id=cid,
                    uri=obs.uri,
                    reason=f"write stalled for {stall_after}; missing {gaps[:5]}",
                    side=FailureSide.JOB,
                )
            )
            known = replace(known, phase="failed")
        state.folders[obs.folder] = known
    return events
