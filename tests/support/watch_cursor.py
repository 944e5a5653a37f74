"""What tests of the writer-watcher's listing cursor share: a store that counts what it lists and
reads, a change feed the test fills, and a watcher on fakes with a clock the test moves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ckpt_ha.contracts.checkpoint import CheckpointIdentity, CheckpointWriteFailedV1
from ckpt_ha.formats import native
from ckpt_ha.storage import FsStore, ObjectStore
from ckpt_ha.storage.port import ObjectInfo, ReadStream
from ckpt_ha.writer_watcher.handlers import Watcher
from tests.support.fakes.publisher import RecordingPublisher
from tests.support.fakes.registry import InMemoryRegistry
from tests.support.fakes.watcher_state import WatchStateBackend

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STALL = timedelta(minutes=5)
FULL = timedelta(minutes=5)
FAILED = CheckpointWriteFailedV1.__name__


class CountingStore(FsStore):
    """A real FsStore that counts listings and object reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []
        self.listings: list[str] = []

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        self.reads.append(key)
        return super().open_read(key, offset=offset, length=length)

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        self.listings.append(prefix)
        return super().list(prefix, start_after=start_after, page_size=page_size)

    def take(self) -> tuple[list[str], list[str]]:
        out = (sorted({k.rsplit("/", 1)[0] for k in self.reads}), list(self.listings))
        self.reads.clear()
        self.listings.clear()
        return out


class Feed:
    """A change feed the test fills: what it names, or None (cannot say)."""

    def __init__(self) -> None:
        self.named: set[str] | None = None

    def changed(self) -> frozenset[str] | None:
        out, self.named = self.named, set()
        return None if out is None else frozenset(out)


def write(store: ObjectStore, folder: str, step: int) -> None:
    identity = CheckpointIdentity(job_id=folder.split("/")[0], run_id="run-1", created_at=T0)
    shards = {"rank-0.bin": b"a" * 64, "rank-1.bin": b"b" * 32}
    native.write(store, folder, shards, step=step, created_at=T0, identity=identity)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def watcher(store: ObjectStore, clock: Clock, full_every: timedelta | None = FULL) -> Watcher:
    state = WatchStateBackend().open(store.uri("x"))
    return Watcher(
        store, RecordingPublisher(), clock, STALL, state, InMemoryRegistry(), full_every=full_every
    )


def published(w: Watcher) -> list[tuple[str, str]]:
    pub = w.publisher
    assert isinstance(pub, RecordingPublisher)
    return [(type(e.data).__name__, e.data.subject_key()) for e in pub.events]
