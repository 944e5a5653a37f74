"""What a fault did to the checkpoints: written, valid, lost, doubled, stuck, and the time the
system took to converge after the fault ended.

* **lost**: a checkpoint the writer committed with no record, or whose record never reached the
  final state its bytes call for (good bytes: valid; damaged bytes: quarantined); a failed write
  whose partial folder has a record that is not final.
* **doubled**: one checkpoint with two records (two ids for one location), a transition applied
  twice (a lifecycle state twice in a record's history), or two ``checkpoint.registered`` events
  for one checkpoint.
* **stuck**: a record of the fault's jobs in a non-final state (writing, pending verification,
  corrupt) at the end.

Read from the registry (Redis) and the event stream, the way an operator would check.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckpt_ha.bus.config import BusConfig
from ckpt_ha.bus.stream_reader import read_events
from ckpt_ha.contracts import CATALOG, Envelope, EventData
from ckpt_ha.contracts.checkpoint import CheckpointState as S
from ckpt_ha.contracts.subjects import job_token
from ckpt_ha.core.lifecycle import EVENT_TARGETS
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.formats import native
from ckpt_ha.registry.redis_registry import Registry
from ckpt_ha.storage import ObjectStore
from tests.system.faults.writer import Save

NON_FINAL = frozenset({S.WRITING, S.PENDING_VERIFICATION, S.CORRUPT})
"""Corrupt is always followed by quarantined (one handler publishes both)."""
FINAL = frozenset(S) - NON_FINAL


@dataclass
class Figures:
    name: str
    written: int
    valid: int
    lost: int
    doubled: int
    stuck: int
    converge_s: float | None = None
    """Seconds from the end of the fault until nothing was lost or stuck; None: never, within
    the bound."""
    evidence: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        took = f"{self.converge_s:.1f}" if self.converge_s is not None else "never"
        return (
            f"FAULT {self.name}: written={self.written} valid={self.valid} lost={self.lost} "
            f"doubled={self.doubled} stuck={self.stuck} converge_s={took}"
        )

    def lose(self, why: str) -> None:
        self.lost += 1
        self.evidence.setdefault("lost", []).append(why)

    def double(self, why: str) -> None:
        self.doubled += 1
        self.evidence.setdefault("doubled", []).append(why)

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.name,
            "written": self.written,
            "valid": self.valid,
            "lost": self.lost,
            "doubled": self.doubled,
            "stuck": self.stuck,
            "converge_s": None if self.converge_s is None else round(self.converge_s, 1),
            "line": self.line(),
            "evidence": self.evidence,
        }


def _lifecycle_states(record: CheckpointRecord) -> list[S]:
    """The states the record's transitions moved it to (pins and owner changes left out)."""
    return [h.state for h in record.history if h.event_type in EVENT_TARGETS]


def _expected(save: Save, store: ObjectStore) -> frozenset[S] | None:
    """The final states a save's checkpoint may end in; None: no record is needed."""
    if save.committed:
        return frozenset({S.QUARANTINED if save.damaged else S.VALID})
    files = [o.key for o in store.list(f"{save.folder}/")]
    if any(key.endswith(native.MANIFEST) for key in files):
        return frozenset({S.VALID})  # the manifest landed though the writer saw the call fail
    return frozenset({S.WRITE_FAILED}) if files else None


async def job_events(cfg: BusConfig, jobs: Iterable[str]) -> list[Envelope[EventData]]:
    out: list[Envelope[EventData]] = []
    for job in jobs:
        subject = f"{cfg.prefix}.ev.*.*.*.{job_token(job)}"
        events, _ = await read_events(cfg, CATALOG, subject, idle_timeout=2.0)
        out += events
    return out


async def count(
    name: str,
    registry: Registry,
    store: ObjectStore,
    jobs: Sequence[str],
    saves: Sequence[Save],
    *,
    want: Mapping[str, frozenset[S]] | None = None,
    events: Sequence[Envelope[EventData]] | None = None,
) -> Figures:
    """The figures now. ``want``: checkpoint id → where it must end, for checkpoints a fault
    moves on further (expired, deleted); every other committed one must end valid, or
    quarantined if its bytes were damaged. ``events``: the jobs' events, to count
    ``registered`` per checkpoint (left out while waiting: the registry suffices there)."""
    records = [r for job in jobs for r in await registry.by_job(job)]
    by_id = {r.checkpoint_id: r for r in records}
    lost: list[str] = []
    doubled: list[str] = []
    for save in saves:
        expect = (want or {}).get(save.checkpoint_id or "") or await asyncio.to_thread(
            _expected, save, store
        )
        at_uri = await registry.by_uri(save.uri)
        if len(at_uri) > 1:
            doubled.append(
                f"{save.folder}: {len(at_uri)} records {[r.checkpoint_id for r in at_uri]}"
            )
        record = by_id.get(save.checkpoint_id or "") or (at_uri[0] if at_uri else None)
        if expect is None:
            if record is not None and record.state not in FINAL:
                lost.append(f"{save.folder}: failed write left {record.state.value}")
            continue
        if record is None:
            lost.append(f"{save.folder}: no record")
        elif record.state not in expect:
            should = "/".join(sorted(s.value for s in expect))
            lost.append(
                f"{save.folder} ({record.checkpoint_id}): {record.state.value}, not {should}"
            )
    for record in records:
        twice = [s.value for s, n in Counter(_lifecycle_states(record)).items() if n > 1]
        if twice:
            doubled.append(f"{record.checkpoint_id}: {twice} applied twice")
    if events is not None:
        registered = Counter(
            e.data.__dict__.get("checkpoint_id")
            for e in {
                e.id: e for e in events if e.type.endswith("checkpoint.registered.v1")
            }.values()
        )
        doubled += [f"{cid}: registered {n} times" for cid, n in registered.items() if n > 1]
    stuck = [
        f"{r.checkpoint_id} ({r.uri}): {r.state.value}" for r in records if r.state in NON_FINAL
    ]
    return Figures(
        name=name,
        written=sum(1 for s in saves if s.committed),
        valid=sum(1 for r in records if r.state is S.VALID),
        lost=len(lost),
        doubled=len(doubled),
        stuck=len(stuck),
        evidence={
            "lost": lost,
            "doubled": doubled,
            "stuck": stuck,
            "records": len(records),
            "failed_writes": [s.error for s in saves if not s.committed],
            "states": dict(Counter(r.state.value for r in records)),
        },
    )


async def converge(
    name: str,
    registry: Registry,
    store: ObjectStore,
    cfg: BusConfig,
    jobs: Sequence[str],
    saves: Sequence[Save],
    *,
    since: float,
    bound_s: float,
    want: Mapping[str, frozenset[S]] | None = None,
    idle: Callable[[], Awaitable[bool]] | None = None,
) -> Figures:
    """Wait (up to ``bound_s`` after ``since``, a `time.monotonic` reading taken when the fault
    ended) until nothing is lost or stuck (and ``idle`` says the services have caught up), then
    count everything, the event stream included."""
    converged: float | None = None
    while True:
        now = time.monotonic()
        figures = await count(name, registry, store, jobs, saves, want=want)
        if figures.lost == 0 and figures.stuck == 0 and (idle is None or await idle()):
            converged = now - since
            break
        if now - since > bound_s:
            break
        await asyncio.sleep(0.5)
    events = await job_events(cfg, jobs)
    figures = await count(name, registry, store, jobs, saves, want=want, events=events)
    figures.converge_s = converged if figures.lost == 0 and figures.stuck == 0 else None
    figures.evidence["events"] = dict(Counter(e.type for e in events))
    return figures


INDEXES = (":job:", ":state:", ":uri:", ":project:")
INDEX_SETS = (":jobs", ":applied", ":applied-at")


def lost_keys(changed: Iterable[str]) -> list[str]:
    """Of registry keys a fault changed or removed, those holding a fact (a checkpoint's record,
    a tier, a pin, the coordinator's state): the indexes over the records (by job, state, URI,
    project; the job and applied-event sets) follow their records and are not counted again."""
    return [
        key
        for key in changed
        if not any(i in key for i in INDEXES) and not key.endswith(INDEX_SETS)
    ]
