"""What the writer-watcher's loop depends on: narrow ports, never a concrete Redis or NATS class.

* ``store``: the storage root it lists (`ObjectStore`), and moves a lost checkpoint's remaining
  bytes aside in;
* ``publisher``: where its events go (`Publisher`, deduplicated on the event id);
* ``registry``: read only (`WatcherRegistry`): whether a committed checkpoint that lost files
  was verified already (then it is corrupt, else the write failed), where the job's other
  checkpoints lie (a quarantine never moves their bytes), and which writes it still holds as
  writing (re-driven past their deadline);
* ``state``: its own memory of what it announced per folder (`WatchStateStore`), so a restart
  announces nothing twice; the service's own key space (`adapters.RedisWatchState` owns it);
* ``clock``: injected time (`Clock`);
* ``changes``: what names the folders that changed since the last scan (`ChangeFeed`), so a
  scan lists and reads only those (`notify.Inotify`); without one every scan lists everything.
"""

from __future__ import annotations

from typing import Protocol

from ckpt_ha.bus.port import Publisher
from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.core.clock import Clock
from ckpt_ha.core.errors import TransientError
from ckpt_ha.core.records import CheckpointRecord
from ckpt_ha.registry.port import CheckpointLookup
from ckpt_ha.storage.owned import JobRecords
from ckpt_ha.storage.port import ObjectStore
from ckpt_ha.writer_watcher.domain import WatchState

__all__ = [
    "ChangeFeed",
    "Clock",
    "ObjectStore",
    "Publisher",
    "WatchStateStore",
    "WatchStateUnavailable",
    "WatcherRegistry",
]


class WatcherRegistry(CheckpointLookup, JobRecords, Protocol):
    """One checkpoint's record, a job's records, and the records in one state (the writes the
    registry holds as writing, for their re-drive)."""

    async def by_state(self, state: CheckpointState) -> list[CheckpointRecord]: ...


class WatchStateUnavailable(TransientError):
    """The watch state could not be read or written; the pass is retried, nothing decided."""

    code = "watch_state_unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"watch state unavailable: {reason}")


class WatchStateStore(Protocol):
    """The watcher's per-folder tracking for one storage root.

    Invariant: what `save` stored, a later `load` (also by a new instance after a restart, on
    the same root) returns; folders absent from a saved state are gone; another root's state is
    separate. Failures raise `WatchStateUnavailable`.
    """

    async def load(self) -> WatchState: ...

    async def save(self, state: WatchState) -> None: ...


class ChangeFeed(Protocol):
    """The folders that changed on the storage root since the last call.

    Invariant: every change made after a call returning a set is named by a later call
    (``<job>/<folder>``, or ``<job>`` for anything in a job's folder itself), or a later call
    returns None. None: the feed cannot say (polling, notifications lost or overflowed): the
    scan lists the whole root.
    """

    def changed(self) -> frozenset[str] | None: ...
