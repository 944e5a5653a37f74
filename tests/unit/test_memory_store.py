"""InMemoryStore: the shared contract, so handler tests on it see what the real adapters do, plus
its test hooks (the outage switch, the injected clock) and the strictness it adds."""

from __future__ import annotations

import io
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from threading import Barrier

import pytest

from ckpt_ha.formats.checksum import READ_CHUNK, checksum, of_bytes
from ckpt_ha.formats.identity import checkpoint_id, checkpoint_id_on
from ckpt_ha.storage import (
    InvalidKey,
    ObjectExists,
    ObjectStore,
    StorageError,
    StorageUnavailable,
    key_for_uri,
)
from ckpt_ha.storage.quarantine import quarantine, restore
from tests.support.fakes.store import InMemoryStore
from tests.support.store_contract import StoreContract, keys_of

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class TestInMemoryStoreContract(StoreContract):
    uri_schemes = ("mem://",)

    @pytest.fixture
    def store(self) -> InMemoryStore:
        return InMemoryStore()


class Ticking:
    """A clock that moves one second on at every reading."""

    def __init__(self, start: datetime = T) -> None:
        self.now = start

    def __call__(self) -> datetime:
        now, self.now = self.now, self.now + timedelta(seconds=1)
        return now


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore("ckpts", clock=lambda: T)


# --- the outage switch ----------------------------------------------------------------------------

OUTAGE_OPERATIONS: dict[str, Callable[[ObjectStore], object]] = {
    "list": lambda s: s.list(),
    "list_page": lambda s: s.list_page(),
    "stat": lambda s: s.stat("k"),
    "exists": lambda s: s.exists("k"),
    "open_read": lambda s: s.open_read("k"),
    "read_bytes": lambda s: s.read_bytes("k", offset=1, length=1),
    "put": lambda s: s.put("k", b"new"),
    "put_stream": lambda s: s.put("k", io.BytesIO(b"new")),
    "put_if_absent": lambda s: s.put_if_absent("fresh", b"new"),
    "copy": lambda s: s.copy("k", "dst"),
    "move": lambda s: s.move("k", "dst"),
    "quarantine": lambda s: s.quarantine("k"),
    "delete": lambda s: s.delete("k"),
}


@pytest.mark.parametrize("operation", OUTAGE_OPERATIONS)
def test_down_makes_every_call_a_transient_outage(store: InMemoryStore, operation: str) -> None:
    store.put("k", b"old", metadata={"a": "1"})
    before = dict(store.objects)
    store.down = True

    with pytest.raises(StorageUnavailable) as caught:
        OUTAGE_OPERATIONS[operation](store)

    assert caught.value.transient
    assert caught.value.backend == "mem"
    assert store.objects == before
    store.down = False
    assert store.read_bytes("k") == b"old"
    OUTAGE_OPERATIONS[operation](store)  # the same call works once the store is back


def test_an_outage_reaches_open_streams_and_listings_in_progress(store: InMemoryStore) -> None:
    for i in range(4):
        store.put(f"k{i}", b"0123456789")
    listing = store.list(page_size=2)
    stream = store.open_read("k0")
    assert [next(listing).key, next(listing).key] == ["k0", "k1"]
    assert stream.read(4) == b"0123"

    store.down = True
    with pytest.raises(StorageUnavailable):
        next(listing)  # the next page is fetched now
    with pytest.raises(StorageUnavailable) as caught:
        stream.read()
    assert caught.value.key == "k0"

    store.down = False
    assert stream.read() == b"456789"


def test_an_outage_hides_whether_an_object_exists(store: InMemoryStore) -> None:
    store.down = True
    with pytest.raises(StorageUnavailable):
        store.stat("missing")
    with pytest.raises(StorageUnavailable):
        store.copy("missing", "dst")


def test_invalid_input_is_reported_before_an_outage(store: InMemoryStore) -> None:
    store.down = True
    with pytest.raises(InvalidKey):
        store.put("../escape", b"x")
    with pytest.raises(InvalidKey):
        store.list("a//")
    with pytest.raises(ValueError, match="page_size"):
        store.list_page(page_size=0)
    assert store.uri("k") == "mem://ckpts/k"  # names a place, touches no storage


# --- the injected clock ---------------------------------------------------------------------------


def test_writes_take_their_mtime_from_the_clock(store: InMemoryStore) -> None:
    written = store.put("job/step-1/a.bin", b"a")
    [listed] = store.list()
    assert written.mtime == store.stat("job/step-1/a.bin").mtime == listed.mtime == T

    store.clock = lambda: T + timedelta(hours=1)
    assert store.copy("job/step-1/a.bin", "copy.bin").mtime == T + timedelta(hours=1)
    assert store.put_if_absent("claim", b"x").mtime == T + timedelta(hours=1)


def test_move_is_a_rename_that_keeps_mtime_and_etag(store: InMemoryStore) -> None:
    before = store.put("a", b"x", metadata={"k": "v"})
    store.clock = lambda: T + timedelta(days=1)

    moved = store.move("a", "b")

    assert (moved.mtime, moved.etag, moved.metadata) == (before.mtime, before.etag, {"k": "v"})


def test_an_aware_clock_in_another_zone_is_stored_as_utc() -> None:
    cet = timezone(timedelta(hours=1))
    store = InMemoryStore(clock=lambda: datetime(2026, 11, 29, 13, 0, tzinfo=cet))
    info = store.put("k", b"x")
    assert info.mtime == T
    assert info.mtime.tzinfo is UTC


def test_a_naive_clock_is_rejected() -> None:
    store = InMemoryStore(clock=lambda: datetime(2026, 11, 29, 12, 0))
    with pytest.raises(ValueError, match="timezone-aware"):
        store.put("k", b"x")
    assert store.objects == {}


def test_checkpoint_ids_follow_the_injected_oldest_mtime() -> None:
    def write_folder(start: datetime) -> str:
        store = InMemoryStore(clock=Ticking(start))
        for name in ("shard-1", "shard-0", "ckpt-ha.manifest.json"):
            store.put(f"job-1/step-5/{name}", b"x")
        return checkpoint_id_on(store, "job-1/step-5")

    assert write_folder(T) == checkpoint_id("job-1/step-5", T)
    assert write_folder(T) == write_folder(T)
    assert write_folder(T + timedelta(seconds=1)) != write_folder(T)


def test_quarantine_and_restore_keep_the_checkpoint_id() -> None:
    store = InMemoryStore(clock=Ticking())
    store.put("job-1/step-5/a.bin", b"a", metadata={"sha256": "ab"})
    store.put("job-1/step-5/b.bin", b"b")
    store.put("job-1/step-5/ckpt-ha.manifest.json", b"{}")
    before = checkpoint_id_on(store, "job-1/step-5")

    target = quarantine(store, "job-1/step-5", "job-1", before)
    assert keys_of(store, "job-1/") == []
    restore(store, target, "job-1/step-5")

    assert keys_of(store) == [
        f"job-1/step-5/{n}" for n in ("a.bin", "b.bin", "ckpt-ha.manifest.json")
    ]
    assert checkpoint_id_on(store, "job-1/step-5") == before
    assert store.stat("job-1/step-5/a.bin").metadata == {"sha256": "ab"}


# --- behaviour the fake shares with one adapter or the other ------------------------------------


@pytest.mark.parametrize(("first", "second"), [("a", "a/b"), ("a/b", "a")])
def test_a_key_cannot_also_be_a_directory_of_keys(
    store: InMemoryStore, first: str, second: str
) -> None:
    store.put(first, b"x")
    store.put("other", b"y")
    operations: list[Callable[[], object]] = [
        lambda: store.put(second, b"y"),
        lambda: store.put_if_absent(second, b"y"),
        lambda: store.copy("other", second),
        lambda: store.move("other", second),
    ]
    for operation in operations:
        with pytest.raises(StorageError) as caught:
            operation()
        assert not caught.value.transient
        assert caught.value.key == second
    assert keys_of(store) == sorted([first, "other"])


def test_racing_put_if_absent_has_exactly_one_winner(store: InMemoryStore) -> None:
    writers = 8
    barrier = Barrier(writers)

    def claim(writer: int) -> int | None:
        barrier.wait()
        try:
            store.put_if_absent("manifest.json", f"writer-{writer}".encode())
        except ObjectExists:
            return None
        return writer

    with ThreadPoolExecutor(writers) as pool:
        winners = [w for w in pool.map(claim, range(writers)) if w is not None]

    assert len(winners) == 1
    assert store.read_bytes("manifest.json") == f"writer-{winners[0]}".encode()


def test_a_stream_is_read_from_its_current_position(store: InMemoryStore) -> None:
    source = io.BytesIO(b"header|body")
    source.seek(7)
    store.put("k", source)
    assert store.read_bytes("k") == b"body"


def test_open_streams_keep_the_bytes_they_opened(store: InMemoryStore) -> None:
    store.put("k", b"old bytes")
    with store.open_read("k", offset=4) as stream:
        store.put("k", b"replaced")
        assert stream.read() == b"bytes"


def test_checksums_stream_through_readinto(store: InMemoryStore) -> None:
    payload = bytes(range(256)) * (READ_CHUNK // 128 + 3)  # a bit over two buffers
    store.put("shard", payload)
    assert checksum(store, "shard") == (of_bytes(payload), len(payload))


def test_uris_name_the_store_and_map_back_to_keys(store: InMemoryStore) -> None:
    uri = store.uri("job-1/step-5/a b#1.bin")
    assert uri == "mem://ckpts/job-1/step-5/a b#1.bin"
    assert key_for_uri(store, uri) == "job-1/step-5/a b#1.bin"
    assert key_for_uri(store, store.uri("job-1/step-5") + "/") == "job-1/step-5"
    assert key_for_uri(store, "mem://other/job-1/step-5") is None
    assert key_for_uri(InMemoryStore("other"), uri) is None


@pytest.mark.parametrize("name", ["", "a/b"])
def test_the_store_name_is_one_uri_component(name: str) -> None:
    with pytest.raises(ValueError, match="store name"):
        InMemoryStore(name)
