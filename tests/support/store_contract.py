"""The behaviour every ObjectStore backend must show, written once and run against each.

Subclass `StoreContract` in a `Test*` class and give it a `store` fixture that returns an empty
store; pytest then runs every test below against that backend.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from ckpt_ha.storage import (
    InvalidKey,
    InvalidMetadata,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
)

DATA = bytes(range(256)) * 4  # 1 KiB, every byte value, position-dependent content

INVALID_KEYS = [
    "",
    "/abs",
    "../x",
    "a/../../b",
    "a/..",
    "./a",
    "a/./b",
    "a//b",
    "a/",
    "a\x00b",
    "line\nbreak",
    "k" * 1025,
]

KEY_OPERATIONS: dict[str, Callable[[ObjectStore, str], object]] = {
    "stat": lambda s, k: s.stat(k),
    "exists": lambda s, k: s.exists(k),
    "open_read": lambda s, k: s.open_read(k),
    "read_bytes": lambda s, k: s.read_bytes(k),
    "put": lambda s, k: s.put(k, b"x"),
    "put_if_absent": lambda s, k: s.put_if_absent(k, b"x"),
    "copy_from": lambda s, k: s.copy(k, "dst"),
    "copy_to": lambda s, k: s.copy("src", k),
    "quarantine": lambda s, k: s.quarantine(k),
    "move_from": lambda s, k: s.move(k, "dst"),
    "move_to": lambda s, k: s.move("src", k),
    "delete": lambda s, k: s.delete(k),
    "uri": lambda s, k: s.uri(k),
}


def keys_of(
    store: ObjectStore, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
) -> list[str]:
    return [info.key for info in store.list(prefix, start_after=start_after, page_size=page_size)]


class StoreContract:
    uri_schemes: tuple[str, ...] = ("file:///", "s3://")
    """How the backend's URIs start; a test double names its own scheme instead of a real one."""

    @pytest.fixture
    def store(self) -> ObjectStore:
        raise NotImplementedError("backend test classes provide the store")

    # --- put / stat / read -------------------------------------------------------------------

    def test_put_then_stat_describes_the_object(self, store: ObjectStore) -> None:
        before = datetime.now(UTC) - timedelta(minutes=1)
        key = "ckpt/step-1/shard-0.bin"
        written = store.put(key, b"hello world", metadata={"sha256": "ab"})
        info = store.stat(key)

        assert (info.key, info.size, info.metadata) == (key, 11, {"sha256": "ab"})
        assert info.mtime.utcoffset() == timedelta(0)
        assert before < info.mtime < datetime.now(UTC) + timedelta(minutes=1)
        assert info.etag
        assert written == info

    def test_put_accepts_a_stream_larger_than_one_copy_chunk(self, store: ObjectStore) -> None:
        payload = os.urandom(3 * 1024 * 1024 + 17)
        store.put("big.bin", io.BytesIO(payload))
        assert store.read_bytes("big.bin") == payload
        assert store.stat("big.bin").size == len(payload)

    def test_put_replaces_bytes_and_all_metadata(self, store: ObjectStore) -> None:
        first = store.put("k", b"old", metadata={"a": "1", "b": "2"})
        second = store.put("k", b"newer", metadata={"b": "3"})
        assert store.read_bytes("k") == b"newer"
        assert store.stat("k").metadata == {"b": "3"}
        assert second.etag != first.etag
        store.put("k", b"plain")
        assert store.stat("k").metadata == {}

    def test_metadata_round_trips(self, store: ObjectStore) -> None:
        metadata = {"sha256": "9f86d081884c7d65", "step": "1200", "source-uri": "s3://b/k?x=1&y=2"}
        store.put("m", b"x", metadata=metadata)
        assert store.stat("m").metadata == metadata

    def test_empty_object(self, store: ObjectStore) -> None:
        store.put("empty", b"")
        assert store.stat("empty").size == 0
        assert store.read_bytes("empty") == b""
        assert store.read_bytes("empty", offset=0, length=10) == b""

    def test_unicode_keys(self, store: ObjectStore) -> None:
        store.put("ckpt/naïve-ü/😀.bin", b"u")
        assert keys_of(store) == ["ckpt/naïve-ü/😀.bin"]
        assert store.read_bytes("ckpt/naïve-ü/😀.bin") == b"u"

    @pytest.mark.parametrize(
        ("offset", "length", "expected"),
        [
            (0, None, DATA),
            (100, None, DATA[100:]),
            (100, 10, DATA[100:110]),
            (0, 1, DATA[:1]),
            (1000, 100, DATA[1000:]),  # runs past the end: cut short, like a file read
            (1024, None, b""),  # exactly at the end
            (2000, 5, b""),  # past the end
            (5, 0, b""),
        ],
    )
    def test_ranged_reads(
        self, store: ObjectStore, offset: int, length: int | None, expected: bytes
    ) -> None:
        store.put("data", DATA)
        assert store.read_bytes("data", offset=offset, length=length) == expected

    def test_open_read_streams_a_range_in_chunks(self, store: ObjectStore) -> None:
        store.put("data", DATA)
        chunks = []
        with store.open_read("data", offset=10, length=500) as stream:
            while chunk := stream.read(64):
                assert len(chunk) <= 64
                chunks.append(chunk)
        assert b"".join(chunks) == DATA[10:510]

    def test_negative_ranges_are_caller_bugs(self, store: ObjectStore) -> None:
        store.put("data", DATA)
        with pytest.raises(ValueError, match="offset"):
            store.read_bytes("data", offset=-1)
        with pytest.raises(ValueError, match="length"):
            store.read_bytes("data", length=-1)

    @pytest.mark.parametrize(
        "operation", ["stat", "open_read", "read_bytes", "copy_from", "quarantine", "move_from"]
    )
    def test_missing_object_is_not_found(self, store: ObjectStore, operation: str) -> None:
        with pytest.raises(ObjectNotFound) as caught:
            KEY_OPERATIONS[operation](store, "no/such/key")
        assert caught.value.key == "no/such/key"
        assert not caught.value.transient

    def test_ranged_read_of_missing_object_is_not_found(self, store: ObjectStore) -> None:
        for length in (None, 0, 5):
            with pytest.raises(ObjectNotFound):
                store.read_bytes("missing", offset=3, length=length)

    # --- create-only writes --------------------------------------------------------------------

    def test_put_if_absent_creates_once(self, store: ObjectStore) -> None:
        created = store.put_if_absent("manifest.json", b"first", metadata={"writer": "a"})
        assert created == store.stat("manifest.json")

        with pytest.raises(ObjectExists) as caught:
            store.put_if_absent("manifest.json", b"second", metadata={"writer": "b"})

        assert caught.value.key == "manifest.json"
        assert not caught.value.transient
        assert store.read_bytes("manifest.json") == b"first"
        assert store.stat("manifest.json").metadata == {"writer": "a"}
        assert keys_of(store) == ["manifest.json"]

    def test_put_if_absent_after_delete_creates_again(self, store: ObjectStore) -> None:
        store.put_if_absent("claim", b"1")
        store.delete("claim")
        store.put_if_absent("claim", b"2")
        assert store.read_bytes("claim") == b"2"

    # --- copy / quarantine / delete ------------------------------------------------------------

    def test_copy_takes_bytes_and_metadata_and_keeps_the_source(self, store: ObjectStore) -> None:
        store.put("src", DATA, metadata={"sha256": "ab"})
        store.put("dst", b"to be replaced", metadata={"stale": "yes"})

        copied = store.copy("src", "dst")

        assert copied == store.stat("dst")
        assert (copied.size, copied.metadata) == (len(DATA), {"sha256": "ab"})
        assert store.read_bytes("dst") == DATA
        assert store.read_bytes("src") == DATA

    def test_copy_onto_itself_is_rejected(self, store: ObjectStore) -> None:
        store.put("same", b"x")
        with pytest.raises(InvalidKey):
            store.copy("same", "same")

    def test_move_takes_bytes_and_metadata_and_removes_the_source(self, store: ObjectStore) -> None:
        store.put("job/step-1/shard.bin", DATA, metadata={"sha256": "ab"})
        store.put("elsewhere/shard.bin", b"to be replaced", metadata={"stale": "yes"})

        moved = store.move("job/step-1/shard.bin", "elsewhere/shard.bin")

        assert moved == store.stat("elsewhere/shard.bin")
        assert (moved.size, moved.metadata) == (len(DATA), {"sha256": "ab"})
        assert store.read_bytes("elsewhere/shard.bin") == DATA
        assert not store.exists("job/step-1/shard.bin")
        assert keys_of(store) == ["elsewhere/shard.bin"]

    def test_move_into_a_new_folder_and_back(self, store: ObjectStore) -> None:
        store.put("a/b/c.bin", b"payload")
        store.move("a/b/c.bin", "q/a/b/c.bin")
        assert keys_of(store) == ["q/a/b/c.bin"]
        store.move("q/a/b/c.bin", "a/b/c.bin")
        assert keys_of(store) == ["a/b/c.bin"]
        assert store.stat("a/b/c.bin").metadata == {}

    def test_move_onto_itself_is_rejected(self, store: ObjectStore) -> None:
        store.put("same", b"x")
        with pytest.raises(InvalidKey):
            store.move("same", "same")
        assert store.read_bytes("same") == b"x"

    def test_quarantine_copies_under_the_prefix(self, store: ObjectStore) -> None:
        key = "ckpt/step-7/shard.bin"
        store.put(key, b"suspect", metadata={"sha256": "ab"})

        moved = store.quarantine(key)
        custom = store.quarantine(key, prefix="bad/2024/")

        assert (moved, custom) == (f"quarantine/{key}", f"bad/2024/{key}")
        assert store.read_bytes(moved) == b"suspect"
        assert store.stat(custom).metadata == {"sha256": "ab"}
        assert store.exists(key)

    def test_quarantine_prefix_must_make_a_valid_key(self, store: ObjectStore) -> None:
        store.put("k", b"x")
        with pytest.raises(InvalidKey):
            store.quarantine("k", prefix="../escape/")

    def test_delete_is_idempotent(self, store: ObjectStore) -> None:
        store.put("ckpt/a", b"x")
        assert store.exists("ckpt/a")
        store.delete("ckpt/a")
        store.delete("ckpt/a")
        store.delete("never/existed")
        assert not store.exists("ckpt/a")
        assert keys_of(store) == []

    # --- listing -------------------------------------------------------------------------------

    def test_empty_store_lists_nothing(self, store: ObjectStore) -> None:
        assert keys_of(store) == []
        assert store.list_page().items == ()
        assert store.list_page().next_cursor is None

    def test_list_is_in_key_order_across_directories(self, store: ObjectStore) -> None:
        # "a-b" < "a/x" < "a0" as strings although the directory "a" sorts before the file
        # "a-b" by name: listing order is key order, not directory-walk order.
        keys = ["a0", "a/y/z", "b", "a-b", "A", "a/x", "a/y.bin", "a/y-", "_"]
        for key in keys:
            store.put(key, key.encode())
        assert keys_of(store) == sorted(keys)

    def test_list_reports_size_and_leaves_metadata_to_stat(self, store: ObjectStore) -> None:
        store.put("k", b"12345", metadata={"a": "1"})
        [info] = store.list()
        assert (info.key, info.size, info.metadata) == ("k", 5, None)
        assert info.etag == store.stat("k").etag
        assert info.mtime.utcoffset() == timedelta(0)

    def test_list_prefix_is_a_string_prefix(self, store: ObjectStore) -> None:
        for key in ["ckpt/step-1/m", "ckpt/step-10/m", "ckpt/step-2/m", "ckpt/step-1.tmp", "z"]:
            store.put(key, b"x")
        expected = ["ckpt/step-1.tmp", "ckpt/step-1/m", "ckpt/step-10/m"]
        assert keys_of(store, "ckpt/step-1") == expected
        assert keys_of(store, "ckpt/step-1/") == ["ckpt/step-1/m"]
        assert keys_of(store, "ckpt/step-1/m") == ["ckpt/step-1/m"]
        assert keys_of(store, "nothing/") == []
        assert keys_of(store, "ckpt/step-9") == []

    def test_list_resumes_after_start_after(self, store: ObjectStore) -> None:
        keys = [f"ckpt/{i:02d}" for i in range(6)] + ["ckpt-other", "d/e"]
        for key in keys:
            store.put(key, b"x")
        assert keys_of(store, start_after="ckpt/02") == ["ckpt/03", "ckpt/04", "ckpt/05", "d/e"]
        assert keys_of(store, "ckpt/", start_after="ckpt/02") == ["ckpt/03", "ckpt/04", "ckpt/05"]
        # The cursor need not be an existing key.
        assert keys_of(store, start_after="ckpt/02x") == ["ckpt/03", "ckpt/04", "ckpt/05", "d/e"]
        assert keys_of(store, start_after="ckpt-") == ["ckpt-other", *keys[:6], "d/e"]
        assert keys_of(store, start_after="zzz") == []

    def test_list_pages_through_more_than_page_size(self, store: ObjectStore) -> None:
        keys = sorted(f"ckpt/step-{i:03d}/shard" for i in range(25))
        for key in keys:
            store.put(key, b"x")

        pages = []
        cursor: str | None = None
        while True:
            page = store.list_page("ckpt/", cursor=cursor, page_size=10)
            pages.append([info.key for info in page.items])
            if page.next_cursor is None:
                break
            assert page.next_cursor == page.items[-1].key
            cursor = page.next_cursor

        assert [len(page) for page in pages] == [10, 10, 5]
        assert [key for page in pages for key in page] == keys
        assert keys_of(store, "ckpt/", page_size=10) == keys
        assert keys_of(store, page_size=10, start_after=keys[9]) == keys[10:]

    def test_a_full_last_page_still_ends_the_listing(self, store: ObjectStore) -> None:
        for i in range(20):
            store.put(f"k{i:02d}", b"x")
        first = store.list_page(page_size=10)
        second = store.list_page(cursor=first.next_cursor, page_size=10)
        assert (len(first.items), len(second.items)) == (10, 10)
        assert second.next_cursor is None

    def test_page_size_must_be_positive(self, store: ObjectStore) -> None:
        with pytest.raises(ValueError, match="page_size"):
            store.list_page(page_size=0)
        with pytest.raises(ValueError, match="page_size"):
            store.list(page_size=0)

    # --- validation ----------------------------------------------------------------------------

    @pytest.mark.parametrize("key", INVALID_KEYS)
    def test_invalid_keys_are_rejected_everywhere(self, store: ObjectStore, key: str) -> None:
        store.put("src", b"x")
        for name, operation in KEY_OPERATIONS.items():
            with pytest.raises(InvalidKey) as caught:
                operation(store, key)
            assert caught.value.key is not None, name
            assert not caught.value.transient, name
        assert keys_of(store) == ["src"]

    @pytest.mark.parametrize("prefix", ["/abs", "../", "a/../", "a//", "./", "a/.."])
    def test_invalid_prefixes_are_rejected(self, store: ObjectStore, prefix: str) -> None:
        with pytest.raises(InvalidKey):
            store.list(prefix)
        with pytest.raises(InvalidKey):
            store.list_page(prefix)

    @pytest.mark.parametrize(
        "metadata",
        [
            {"Upper": "x"},
            {"under_score": "x"},
            {"": "x"},
            {"k": "naïve"},
            {"k": " padded"},
            {"k": "two\nlines"},
            {"k": "x" * 2100},
            {"ckpt-ha-create-id": "mine"},  # reserved: the S3 backend's own create marker
        ],
    )
    def test_metadata_s3_cannot_carry_is_rejected(
        self, store: ObjectStore, metadata: dict[str, str]
    ) -> None:
        with pytest.raises(InvalidMetadata):
            store.put("k", b"x", metadata=metadata)
        with pytest.raises(InvalidMetadata):
            store.put_if_absent("k", b"x", metadata=metadata)
        assert keys_of(store) == []

    def test_uri_names_the_key(self, store: ObjectStore) -> None:
        uri = store.uri("ckpt/step-1/shard.bin")
        assert uri.startswith(self.uri_schemes)
        assert uri.endswith("/ckpt/step-1/shard.bin")
