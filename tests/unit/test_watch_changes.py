"""The writer-watcher's listing cursor: which folders a scan lists and reads, and that reading only
those decides exactly what reading every folder decides."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from ckpt_ha.writer_watcher import changes, domain
from ckpt_ha.writer_watcher.changes import Cursor, Diff, diff, fingerprint
from ckpt_ha.writer_watcher.domain import Tracked, WatchState
from ckpt_ha.writer_watcher.notify import folder_of
from tests.support.watch_cursor import (
    FAILED,
    FULL,
    STALL,
    T0,
    Clock,
    CountingStore,
    Feed,
    published,
    watcher,
    write,
)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path)


# -- pure: fingerprints, diffs, the cursor, what to read ------------------------------------------


def test_a_fingerprint_is_the_listing_in_any_order() -> None:
    later = T0 + timedelta(microseconds=1)
    a = ("rank-0.bin", 10, T0, "v1")
    b = ("manifest.json", 200, later, "v2")
    assert fingerprint([a, b]) == fingerprint([b, a])
    assert fingerprint([a, b]) != fingerprint([a])
    assert fingerprint([a]) != fingerprint([("rank-0.bin", 11, T0, "v1")])  # size
    assert fingerprint([a]) != fingerprint([("rank-0.bin", 10, later, "v1")])  # time
    assert fingerprint([a]) != fingerprint([("rank-0.bin", 10, T0, "v9")])  # version tag
    assert fingerprint([a]) != fingerprint([("rank-1.bin", 10, T0, "v1")])  # path
    assert fingerprint([a]) != fingerprint([("rank-0.bin", 10, T0, None)])


def test_a_full_listing_names_new_and_changed_folders_and_the_vanished() -> None:
    previous = {"j/a": 1, "j/b": 2, "k/c": 3}
    change = diff(previous, {"j/a": 1, "j/b": 20, "k/d": 4})
    assert change == Diff(changed=frozenset({"j/b", "k/d"}), vanished=frozenset({"k/c"}))
    assert diff(previous, dict(previous)) == Diff(frozenset(), frozenset())


def test_a_scoped_listing_only_judges_folders_in_its_scope() -> None:
    previous = {"j/a": 1, "j/b": 2, "k/c": 3, "k/e": 5}
    # Only j/a and all of job k were listed: j/b is not gone, it was not looked at.
    change = diff(previous, {"j/a": 10, "k/e": 5}, scope={"j/a", "k"})
    assert change == Diff(changed=frozenset({"j/a"}), vanished=frozenset({"k/c"}))
    assert diff(previous, {}, scope=set()) == Diff(frozenset(), frozenset())


def test_the_cursor_lists_everything_first_and_again_every_interval() -> None:
    cursor = Cursor(full_every=FULL)
    assert cursor.full_due(T0)  # never listed
    listed = {"j/a": 1, "j/b": 2}
    cursor.advance(listed, diff(cursor.seen, listed), full=True, now=T0)
    assert cursor.seen == listed
    assert not cursor.full_due(T0 + FULL - timedelta(seconds=1))
    assert cursor.full_due(T0 + FULL)
    # A scoped pass updates what it listed and drops what vanished in its scope, nothing else.
    scoped = {"j/a": 10, "j/c": 3}
    change = diff(cursor.seen, scoped, scope={"j"})
    assert change.vanished == {"j/b"}
    cursor.advance(scoped, change, full=False, now=T0 + timedelta(seconds=10))
    assert cursor.seen == {"j/a": 10, "j/c": 3}
    assert cursor.last_full == T0  # a scoped pass is no full listing
    cursor.reset()
    assert cursor.full_due(T0)
    assert cursor.seen == {}


def test_without_an_interval_every_scan_lists_everything() -> None:
    cursor = Cursor(full_every=None)
    cursor.advance({}, Diff(frozenset(), frozenset()), full=True, now=T0)
    assert cursor.full_due(T0)


def tracked(phase: str, cid: str = "c") -> Tracked:
    return Tracked(cid, T0, T0, (("manifest.json", 1),), phase=phase)


def test_only_changed_time_driven_undecided_and_redriven_folders_are_read() -> None:
    state = WatchState(
        {
            "j/new": tracked("new"),
            "j/writing": tracked("writing"),
            "j/committed": tracked("committed", "c1"),
            "j/failed": tracked("failed"),
            "j/ignored": tracked(domain.IGNORED),
            "j/other": tracked("committed", "c2"),
        },
        retry={"j/bad"},
    )
    assert domain.to_read(state, {"j/committed"}, redriven={"j/other"}) == {
        "j/new",  # its id settles with time
        "j/writing",  # the stall timeout runs with time
        "j/committed",  # its listing changed
        "j/bad",  # undecided last scan
        "j/other",  # a re-drive announces from it
    }
    assert domain.to_read(WatchState({"j/c": tracked("committed")}), ()) == set()


def test_changed_paths_name_their_folder_or_job() -> None:
    root = Path("/data/ckpt")
    assert folder_of(root, "/data/ckpt/job-a/step-1/rank-0.bin") == "job-a/step-1"
    assert folder_of(root, "/data/ckpt/job-a/step-1/sub/deep.bin") == "job-a/step-1"
    assert folder_of(root, "/data/ckpt/job-a/step-1") == "job-a/step-1"
    assert folder_of(root, "/data/ckpt/job-a") == "job-a"
    assert folder_of(root, "/data/ckpt") is None  # the root itself: list everything
    assert folder_of(root, "/elsewhere/x") is None


# -- the handler: what it reads, and that it decides as a full read would ----------------------


async def test_an_idle_scan_reads_nothing_and_a_named_folder_is_read_alone(
    store: CountingStore,
) -> None:
    for i in range(3):
        write(store, f"job-a/step-{i}", i)
    clock = Clock()
    w = watcher(store, clock)
    feed = Feed()
    w.changes = feed
    await w.scan_once()
    assert store.take() == (["job-a/step-0", "job-a/step-1", "job-a/step-2"], [""])
    assert w.last_scan is not None
    assert w.last_scan.full
    assert len(published(w)) == 3  # committed, each

    clock.now += timedelta(seconds=2)
    await w.scan_once()  # nothing named, nothing in progress: no listing, no read
    assert store.take() == ([], [])
    assert w.last_scan is not None
    assert not w.last_scan.full

    (store.root / "job-a/step-1/rank-1.bin").unlink()
    feed.named = {"job-a/step-1"}
    clock.now += timedelta(seconds=2)
    await w.scan_once()
    reads, listings = store.take()
    assert listings == ["job-a/step-1/"]
    assert reads == ["job-a/step-1"]
    assert published(w)[-1][0] == FAILED


async def test_a_change_the_feed_missed_is_found_by_the_next_full_listing(
    store: CountingStore,
) -> None:
    for i in range(2):
        write(store, f"job-a/step-{i}", i)
    clock = Clock()
    w = watcher(store, clock)
    feed = Feed()
    w.changes = feed
    await w.scan_once()
    (store.root / "job-a/step-0/rank-1.bin").unlink()  # the feed never names it
    clock.now += timedelta(seconds=2)
    await w.scan_once()
    assert len(published(w)) == 2
    store.take()
    clock.now = T0 + FULL
    await w.scan_once()
    assert w.last_scan is not None
    assert w.last_scan.full
    reads, listings = store.take()
    assert listings == [""]
    assert reads == ["job-a/step-0"]  # the whole root listed, only what differs read
    assert published(w)[-1][0] == FAILED


async def test_a_failed_pass_makes_the_next_one_list_everything(store: CountingStore) -> None:
    write(store, "job-a/step-0", 0)
    clock = Clock()
    w = watcher(store, clock)
    feed = Feed()
    w.changes = feed
    await w.scan_once()
    (store.root / "job-a/step-0/rank-1.bin").unlink()
    feed.named = {"job-a/step-0"}
    w.state_store.backend.down = True  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="down"):
        await w.scan_once()  # the named folder is taken from the feed, the pass fails
    w.state_store.backend.down = False  # type: ignore[attr-defined]
    await w.scan_once()
    assert w.last_scan is not None
    assert w.last_scan.full
    assert published(w)[-1][0] == FAILED


@pytest.mark.parametrize("batch", [2000, 2])
async def test_reading_only_what_changed_decides_what_reading_everything_decides(
    tmp_path: Path, batch: int
) -> None:
    """Two watchers on one root through a day of writes, commits, stalls, losses and removals:
    one lists what the feed names and reads what changed (deciding ``batch`` folders at a
    time), the other reads every folder on every scan (its cursor forgotten before each) in one
    batch. Same events, same order, same state."""
    store = CountingStore(tmp_path)
    clock = Clock()
    lean, full = watcher(store, clock), watcher(store, clock, full_every=None)
    lean.decide_batch = batch
    feed = Feed()
    lean.changes = feed

    async def scan(*named: str) -> None:
        feed.named = set(named) if feed.named is not None else None
        full.cursor.reset()
        await lean.scan_once()
        await full.scan_once()
        clock.now += timedelta(seconds=2)

    for i in range(4):
        write(store, f"job-a/step-{i}", i)
    await scan()
    # A write in progress (no manifest yet), settling, then stalling.
    (store.root / "job-b/step-9").mkdir(parents=True)
    (store.root / "job-b/step-9/rank-0.bin").write_bytes(b"x" * 8)
    await scan("job-b/step-9")
    await scan()
    await scan()
    clock.now += STALL
    await scan()
    # A committed checkpoint loses a shard; another folder is removed; a new job appears.
    (store.root / "job-a/step-2/rank-1.bin").unlink()
    shutil.rmtree(store.root / "job-a/step-3")
    write(store, "job-c/step-1", 1)
    await scan("job-a/step-2", "job-a", "job-c")
    # A folder that is no job's, and a write removed before it committed.
    (store.root / "-bad/x").mkdir(parents=True)
    (store.root / "-bad/x/f.bin").write_bytes(b"1")
    (store.root / "job-d/step-1").mkdir(parents=True)
    (store.root / "job-d/step-1/rank-0.bin").write_bytes(b"1")
    await scan("-bad/x", "job-d/step-1")
    await scan()
    (store.root / "job-d/step-1/rank-0.bin").unlink()
    await scan("job-d/step-1")
    await scan()

    assert published(lean) == published(full)
    kinds = {kind for kind, _ in published(full)}
    assert {"CheckpointCommittedV1", "CheckpointWritingV1", FAILED} <= kinds
    assert lean.state is not None
    assert full.state is not None
    assert lean.state.folders == full.state.folders


def test_the_cursor_keeps_one_small_int_per_folder() -> None:
    listed = {
        f"job-{j}/step-{s}": fingerprint([("m", s, T0, None)]) for j in range(3) for s in range(3)
    }
    assert all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in listed.values())
    assert changes.diff(listed, listed).changed == frozenset()
