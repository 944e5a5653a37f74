"""The watcher's loop: list storage, advance the domain state, publish what it decided.

Fetch (storage listing, watch state, the registry's state of the checkpoints that lost files)
→ decide (`domain.observe`) → persist (move a lost checkpoint's bytes aside, save the state)
→ publish. Every dependency is a port (`ckpt_ha.writer_watcher.ports`).

A pass lists the whole root, or only the folders the change feed names (`ports.ChangeFeed`),
and reads the commit evidence of the folders `domain.to_read` names: those whose listing
differs from the cursor (`changes.Cursor`, one fingerprint per folder) and those decided by
time. The cursor advances only with the state, once every event is published.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from ckpt_ha.contracts import EventData, build
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.runtime.leader import stop_if_cancelled
from ckpt_ha.storage import StorageError, bounded, key_for_uri
from ckpt_ha.storage.quarantine_move import isolate
from ckpt_ha.telemetry import tracing
from ckpt_ha.telemetry.metrics import ReconcileMetrics
from ckpt_ha.writer_watcher import adapters, changes, domain, notify
from ckpt_ha.writer_watcher.ports import (
    ChangeFeed,
    Clock,
    ObjectStore,
    Publisher,
    WatcherRegistry,
    WatchStateStore,
)
from ckpt_ha.writer_watcher.removals import REMOVAL_GRACE

SOURCE = "ckpt-ha/writer-watcher"
log = logging.getLogger("ckpt_ha.writer_watcher")


@dataclass(frozen=True)
class Redrive:
    """How the watcher re-drives writes the registry holds as ``writing`` for too long."""

    deadline: timedelta
    """Writing for longer than this (from the registry's `writing` entry) is overdue."""
    interval: timedelta
    """How often the registry's writing records are read (at most once per scan)."""
    metrics: ReconcileMetrics | None = None


@dataclass(frozen=True)
class ScanStats:
    """What the last pass touched."""

    full: bool
    """The whole root was listed (else only the folders the change feed named, and those read
    on every pass)."""
    listed: int
    """Folders listed."""
    read: int
    """Folders whose commit evidence was read (decided)."""
    vanished: int


READ_BATCH = 500
"""Folders whose commit evidence one storage call reads."""
DECIDE_BATCH = 2000
"""Folders one step of a pass reads, decides and publishes (bounds what a pass holds)."""


class Watcher:
    def __init__(
        self,
        store: ObjectStore,
        publisher: Publisher,
        clock: Clock,
        stall_after: timedelta,
        state_store: WatchStateStore,
        registry: WatcherRegistry,
        redrive: Redrive | None = None,
        full_every: timedelta | None = None,
        removal_grace: timedelta = REMOVAL_GRACE,
    ) -> None:
        self.store = store
        self.removal_grace = removal_grace
        """How long a committed folder short of files, or gone, waits for a decision."""
        self.publisher = publisher
        self.clock = clock
        self.stall_after = stall_after
        self.state_store = state_store
        self.registry = registry
        self.redrive = redrive
        """None: nothing is re-driven (the registry's state index is not read)."""
        self._next_redrive: datetime | None = None
        self.storage_trouble: tuple[datetime, str] | None = None
        """When and how storage last failed a scan (classifies stalled writes)."""
        self.state: domain.WatchState | None = None
        """None until loaded from Redis: nothing is decided before the watcher knows what it
        announced in an earlier life."""
        self.changes: ChangeFeed | None = None
        """What names the folders that changed between scans (`notify.Inotify`); None, or a
        feed that cannot say, lists the whole root on every scan."""
        self.cursor = changes.Cursor(full_every)
        """Each folder's fingerprint as last listed; ``full_every``: how often the whole root is
        listed even when the change feed names what changed."""
        self.last_scan: ScanStats | None = None
        self.decide_batch = DECIDE_BATCH

    async def scan_once(self) -> int:
        """One pass; returns how many events were published."""
        if self.state is None:
            self.state = await self.state_store.load()
            self.cursor.reset()  # what another life of the watcher listed is not known here
        try:
            return await self._pass(self.state)
        except BaseException:
            # What the change feed named is taken; the next pass lists the whole root (and
            # still reads only what differs from the cursor, which this pass left as it was).
            self.cursor.last_full = None
            raise

    async def _pass(self, kept: domain.WatchState) -> int:
        stuck = await self._stuck_writes()
        started = self.clock()
        named = self.changes.changed() if self.changes is not None else None
        full = named is None or self.cursor.full_due(started)
        redriven = self._folders_of(kept, stuck)
        extra = domain.to_read(kept, (), redriven)
        scope = None if full else {*(named or ()), *extra}
        groups = await bounded.call(adapters.list_folders, self.store, scope)
        listed = adapters.fingerprints(groups)
        change = changes.diff(self.cursor.seen, listed, scope)
        wanted = sorted((change.changed | extra) & groups.keys())
        vanished = set(change.vanished)
        if full:  # also what an earlier life tracked and is gone (the cursor starts empty)
            vanished |= kept.folders.keys() - listed.keys()
        # Decide on a copy; keep it only once every event is published, so a failed publish
        # is decided (and, with its deterministic id, deduplicated) again on the next pass.
        state = domain.WatchState(dict(kept.folders))
        now = self.clock()
        # Read, decide and publish a batch of folders at a time: what a pass holds stays
        # bounded when many folders changed (a first scan of a large root).
        size = self.decide_batch
        batches = [wanted[i : i + size] for i in range(0, len(wanted), size)]
        published = 0
        redriven_seen: list[domain.Observation] = []
        for i, batch in enumerate(batches or [[]]):
            last = i == max(len(batches) - 1, 0)
            observations = await self._observe(groups, batch)
            redriven_seen += [o for o in observations if o.folder in redriven]
            asked = domain.needs_registry(state, observations)
            registered = {cid: await self._registered(cid) for cid in asked}
            events = domain.observe(
                state,
                observations,
                now,
                self.stall_after,
                registered,
                self.storage_trouble,
                vanished=vanished if last else (),
                removal_grace=self.removal_grace,
            )
            if last and stuck is not None and self.redrive is not None:
                deadline = self.redrive.deadline
                overdue = domain.overdue_writes(stuck, state, redriven_seen, now, deadline)
                self._round_done(stuck, overdue, now)
                events += overdue
            await self._publish(state, events, {o.folder for o in observations} | redriven)
            published += len(events)
        self.last_scan = ScanStats(full, len(groups), len(wanted), len(vanished))
        self.state = state
        await self.state_store.save(state)
        self.cursor.advance(listed, change, full, started)
        return published

    async def _publish(
        self, state: domain.WatchState, events: list[EventData], folders: set[str]
    ) -> None:
        """Log the notes, move quarantined bytes aside, publish ``events`` (about checkpoints
        tracked in ``folders``, or no longer tracked), each continuing its checkpoint's trace."""
        for note in state.notes:
            log.warning("%s", note)
        state.notes.clear()
        # A checkpoint quarantined here has its remaining bytes moved aside first.
        with tracing.span("storage.isolate") if events else contextlib.nullcontext():
            isolated = await isolate(self.store, events, self.registry)
        by_id = {state.folders[f].checkpoint_id: f for f in folders if f in state.folders}
        for data in isolated:
            key = f"{data.EVENT_TYPE}|{data.subject_key()}"
            # The first event about a checkpoint starts its trace; later ones continue it.
            folder = by_id.get(data.subject_key())
            tracked = state.folders.get(folder) if folder is not None else None
            parent = tracked.traceparent if tracked is not None else None
            sent = await self.publisher.publish(
                build(data, source=SOURCE, time=self.clock(), key=key, traceparent=parent)
            )
            if tracked is not None and folder is not None and tracked.traceparent is None:
                state.folders[folder] = dataclasses.replace(tracked, traceparent=sent.traceparent)

    async def _observe(
        self, groups: adapters.Listed, folders: list[str]
    ) -> list[domain.Observation]:
        """The folders' observations, their commit evidence read in batches (each batch one
        bounded storage call, so a first scan of a large root is not one call's timeout)."""
        out: list[domain.Observation] = []
        for i in range(0, len(folders), READ_BATCH):
            batch = folders[i : i + READ_BATCH]
            out += await bounded.call(
                lambda b=batch: [adapters.observation(self.store, f, groups[f]) for f in b]
            )
        return out

    @staticmethod
    def _folders_of(state: domain.WatchState, stuck: list[CheckpointRecord] | None) -> set[str]:
        """The folders holding the checkpoints a re-drive round announces about."""
        if not stuck:
            return set()
        ids = {r.checkpoint_id for r in stuck}
        return {f for f, t in state.folders.items() if t.checkpoint_id in ids}

    async def _stuck_writes(self) -> list[CheckpointRecord] | None:
        """The registry's writing records on this storage root when a re-drive round is due
        (None: not due, or the registry did not answer: detection goes on without it)."""
        if self.redrive is None:
            return None
        now = self.clock()
        if self._next_redrive is not None and now < self._next_redrive:
            return None
        try:
            records = await self.registry.by_state(CheckpointState.WRITING)
        except TransientError as exc:
            log.warning("writing records unavailable, re-drive next round: %s", exc)
            if self.redrive.metrics is not None:
                self.redrive.metrics.interrupted.labels(self.redrive.metrics.service).inc()
            return None
        self._next_redrive = now + self.redrive.interval
        return [r for r in records if key_for_uri(self.store, r.uri) is not None]

    def _round_done(
        self, stuck: list[CheckpointRecord], overdue: list[EventData], now: datetime
    ) -> None:
        assert self.redrive is not None
        late = [r for r in stuck if domain.writing_overdue(r, now, self.redrive.deadline)]
        for data in overdue:
            log.warning("re-driving %s: still writing in the registry: %s", data.subject_key(),
                        data.EVENT_TYPE)  # fmt: skip
        if self.redrive.metrics is not None:
            writing = CheckpointState.WRITING.value
            self.redrive.metrics.round(writing, len(late), len(overdue), now.timestamp())

    async def _registered(self, checkpoint_id: str) -> CheckpointState | None:
        record = await self.registry.get(checkpoint_id)
        return record.state if record is not None else None

    async def run(self, interval_s: float, wakeup: notify.Wakeup | None = None) -> None:
        """Scan, then wait for a change notification or the poll interval, forever. The state
        is loaded again at each start: a replica that takes the scan over from another (or back
        from it) continues from what the last holder announced, never from its own old copy."""
        wakeup = wakeup or notify.Polling()
        self.changes = wakeup
        self.state = None
        while True:
            try:
                await self.scan_once()
            except StorageError as exc:  # an outage delays detection; it decides nothing
                log.warning("storage scan failed, retrying: %s", exc)
                self.storage_trouble = (self.clock(), str(exc)[:200])
            except TransientError as exc:
                log.warning("watch state or registry unavailable, retrying: %s", exc)
            except Exception:  # the loop must outlive any one bad pass
                log.exception("scan failed, retrying")
            stop_if_cancelled()
            await wakeup.wait(interval_s)
