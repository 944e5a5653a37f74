"""Which checkpoint folders a scan has to read: a listing cursor. Pure: no I/O, no clock reads.

A scan used to read every folder's commit evidence (its manifest, its index, …) on every pass.
Most folders of a large root are finished checkpoints that never change, so the watcher keeps,
per folder, one small fingerprint of what its last listing showed (each file's path, size,
modification time and version tag, hashed to one 64-bit int) and reads a folder again only when:

* its fingerprint changed, or it is new, or it vanished (`diff`);
* its decision depends on time, not on its files: a write in progress (`domain.observe`
  announces `writing` once the id is settled and `write_failed` after the stall timeout, with
  nothing changing on storage);
* it is not tracked yet although it was listed before (its first decision failed), or the
  registry holds its checkpoint as writing past the deadline (a re-drive announces from what
  the folder shows).

What is listed depends on the source of changes. On S3 there is no change feed: each poll lists
the whole root (one LIST request per 1,000 keys) and the fingerprints keep the manifest reads
to the folders that changed. On a local filesystem the change notifications name the folders
that changed, and only those are listed; every ``full_every`` a full listing runs anyway
(level-triggered: a lost or overflowed notification delays detection by at most that long,
and never changes a decision).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

Fingerprint = int
"""A 64-bit hash of one folder's listing (see `fingerprint`)."""

Entry = tuple[str, int, datetime, str | None]
"""One listed file: path in the folder, size, modification time, version tag (an S3 ETag, a
local file's inode+size+mtime version; None when the backend has none)."""


def fingerprint(entries: Iterable[Entry]) -> Fingerprint:
    """What one folder's listing showed, as one int: equal for the same files at the same sizes,
    times and version tags, in any order. Python's own hash (a process seeds it differently):
    held in memory only, never stored, so a restarted watcher lists and reads everything once."""
    return hash(tuple(sorted(entries)))


@dataclass(frozen=True)
class Diff:
    changed: frozenset[str]
    """Listed folders that are new or whose fingerprint changed."""
    vanished: frozenset[str]
    """Folders known before that the listing no longer shows."""


def diff(
    previous: Mapping[str, Fingerprint],
    listed: Mapping[str, Fingerprint],
    scope: Collection[str] | None = None,
) -> Diff:
    """What changed between ``previous`` and ``listed``. ``scope`` None: ``listed`` is the whole
    root; else only the folders in ``scope`` (``<job>/<folder>`` or a whole ``<job>``) were
    listed, and a known folder in scope that is absent from ``listed`` vanished."""
    changed = frozenset(f for f, fp in listed.items() if previous.get(f) != fp)
    if scope is None:
        vanished = frozenset(previous.keys() - listed.keys())
    else:
        # A scope names a handful of folders: look those up. Only a whole job (rare: a change
        # in the job's own folder) walks what is known.
        jobs = {s for s in scope if "/" not in s}
        candidates = [s for s in scope if "/" in s]
        if jobs:
            candidates += [f for f in previous if f.split("/", 1)[0] in jobs]
        vanished = frozenset(f for f in candidates if f in previous and f not in listed)
    return Diff(changed, vanished)


@dataclass
class Cursor:
    """The fingerprint of every folder of the root as last listed, and when the last full
    listing ran. Advanced (`advance`) only once a scan's decisions are kept: a pass that fails
    leaves it, so the next one reads the same folders again."""

    full_every: timedelta | None = None
    """How often a full listing runs even when change notifications name what changed (None:
    every scan lists everything, as polling does)."""
    seen: dict[str, Fingerprint] = field(default_factory=dict)
    last_full: datetime | None = None

    def full_due(self, now: datetime) -> bool:
        """The next scan must list the whole root: none did yet, or ``full_every`` has passed."""
        if self.last_full is None or self.full_every is None:
            return True
        return now - self.last_full >= self.full_every

    def advance(
        self, listed: Mapping[str, Fingerprint], change: Diff, full: bool, now: datetime
    ) -> None:
        if full:
            self.seen = dict(listed)
            self.last_full = now
            return
        for folder in change.vanished:
            self.seen.pop(folder, None)
        self.seen.update(listed)

    def reset(self) -> None:
        """Forget everything: the next scan lists the whole root (a new scan lease, a state
        reloaded from another replica's save)."""
        self.seen = {}
        self.last_full = None
