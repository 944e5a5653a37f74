"""FsStore: the shared contract on a real directory, plus what only a filesystem can get wrong."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from threading import Barrier

import pytest

from ckpt_ha.storage import (
    FsStore,
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    S3Store,
    StorageError,
    StorageUnavailable,
    open_store,
)
from ckpt_ha.storage.fs_read import ancestors_checked_once, classify_os_error, through_link
from tests.support.store_contract import StoreContract, keys_of


class TestFsStoreContract(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FsStore:
        return FsStore(tmp_path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def store(root: Path) -> FsStore:
    return FsStore(root)


def files_in(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def test_objects_are_plain_files_and_metadata_a_hidden_sidecar(store: FsStore, root: Path) -> None:
    info = store.put("ckpt/shard.bin", b"bytes", metadata={"sha256": "ab"})

    assert (root / "ckpt" / "shard.bin").read_bytes() == b"bytes"
    assert files_in(root / "ckpt") == [f".shard.bin.{info.etag}.ckpt-meta.json", "shard.bin"]
    assert keys_of(store) == ["ckpt/shard.bin"]


def test_overwrite_drops_the_old_sidecar_and_no_temp_files_remain(
    store: FsStore, root: Path
) -> None:
    store.put("k", b"1", metadata={"a": "1"})
    second = store.put("k", b"22", metadata={"a": "2"})
    assert files_in(root) == [f".k.{second.etag}.ckpt-meta.json", "k"]

    store.put("k", b"333")
    assert files_in(root) == ["k"]


def test_put_if_absent_that_loses_leaves_no_trace(store: FsStore, root: Path) -> None:
    store.put_if_absent("claim", b"first")
    with pytest.raises(ObjectExists):
        store.put_if_absent("claim", b"second", metadata={"writer": "b"})
    assert files_in(root) == ["claim"]


def test_racing_put_if_absent_has_exactly_one_winner(store: FsStore) -> None:
    writers = 8
    barrier = Barrier(writers)

    def claim(writer: int) -> int | None:
        barrier.wait()
        try:
            store.put_if_absent("manifest.json", f"writer-{writer}".encode() * 10_000)
        except ObjectExists:
            return None
        return writer

    with ThreadPoolExecutor(writers) as pool:
        winners = [w for w in pool.map(claim, range(writers)) if w is not None]

    assert len(winners) == 1
    assert store.read_bytes("manifest.json") == f"writer-{winners[0]}".encode() * 10_000


def test_bytes_changed_behind_the_stores_back_lose_their_stale_metadata(
    store: FsStore, root: Path
) -> None:
    store.put("k", b"original", metadata={"sha256": "of-original"})
    (root / "k").write_bytes(b"rewritten in place by another tool")

    assert store.stat("k").metadata == {}
    assert store.read_bytes("k") == b"rewritten in place by another tool"


def test_files_written_by_other_tools_are_objects(store: FsStore, root: Path) -> None:
    (root / "step-1").mkdir()
    (root / "step-1" / "model.pt").write_bytes(b"torch")
    (root / "empty-dir").mkdir()

    assert keys_of(store) == ["step-1/model.pt"]
    assert store.stat("step-1/model.pt").size == 5
    assert store.stat("step-1/model.pt").metadata == {}


@pytest.mark.parametrize("key", [".ckpt-tmp-123", "a/.b.1-2-3.ckpt-meta.json"])
def test_names_the_store_uses_internally_are_not_keys(store: FsStore, key: str) -> None:
    with pytest.raises(InvalidKey):
        store.put(key, b"x")


def test_directories_are_not_objects(store: FsStore) -> None:
    store.put("dir/file", b"x")
    with pytest.raises(ObjectNotFound):
        store.stat("dir")
    with pytest.raises(ObjectNotFound):
        store.read_bytes("dir")
    store.delete("dir")
    assert store.exists("dir/file")


def test_a_key_cannot_also_be_a_directory_of_keys(store: FsStore) -> None:
    store.put("a", b"x")
    with pytest.raises(StorageError) as caught:
        store.put("a/b", b"y")
    assert not caught.value.transient
    assert store.read_bytes("a") == b"x"


def test_delete_prunes_empty_directories_but_not_the_root(store: FsStore, root: Path) -> None:
    store.put("ckpt/step-1/shard-0", b"x")
    store.put("ckpt/step-2/shard-0", b"x")

    store.delete("ckpt/step-1/shard-0")
    assert files_in(root / "ckpt") == ["step-2"]

    store.delete("ckpt/step-2/shard-0")
    assert files_in(root) == []
    assert root.is_dir()


def test_keys_may_not_escape_the_root_through_symlinks(
    store: FsStore, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    (root / "escape").symlink_to(outside)

    for operation in (
        lambda: store.stat("escape/secret"),
        lambda: store.read_bytes("escape/secret"),
        lambda: store.put("escape/planted", b"x"),
        lambda: store.delete("escape/secret"),
        lambda: store.list("escape/"),
    ):
        with pytest.raises(InvalidKey, match="outside the store root"):
            operation()
    assert files_in(outside) == ["secret"]


def test_symlinks_inside_the_root_are_readable_but_not_listed(store: FsStore, root: Path) -> None:
    store.put("step-1/model.pt", b"weights")
    (root / "latest").symlink_to(root / "step-1")
    (root / "latest.pt").symlink_to(root / "step-1" / "model.pt")

    assert keys_of(store) == ["step-1/model.pt"]
    assert store.read_bytes("latest/model.pt") == b"weights"
    assert store.read_bytes("latest.pt") == b"weights"


def test_a_listing_never_follows_a_symlink_on_the_way_to_its_prefix(
    store: FsStore, root: Path
) -> None:
    """Listing "latest/" (a link to another folder) lists nothing, as the walk from the root
    does: a caller that lists, then moves or deletes what it listed, never reaches the files of
    the folder the link points to."""
    store.put("step-1/model.pt", b"weights")
    (root / "latest").symlink_to(root / "step-1")
    assert keys_of(store, "latest/") == []
    assert keys_of(store, "latest/sub/") == []
    assert keys_of(store, "step-1/") == ["step-1/model.pt"]


def test_a_missing_root_is_unavailable_and_never_created(tmp_path: Path) -> None:
    root = tmp_path / "unmounted"
    store = FsStore(root)

    for operation in (
        lambda: store.list(),
        lambda: store.list_page(),
        lambda: store.stat("k"),
        lambda: store.read_bytes("k"),
        lambda: store.put("k", b"x"),
        lambda: store.delete("k"),
    ):
        with pytest.raises(StorageUnavailable) as caught:
            operation()
        assert caught.value.transient
    assert not root.exists()


@pytest.mark.parametrize(
    ("code", "kind", "transient"),
    [
        (errno.EIO, StorageUnavailable, True),
        (errno.ENOSPC, StorageUnavailable, True),
        (errno.ESTALE, StorageUnavailable, True),
        (errno.EACCES, StorageError, False),
        (errno.EROFS, StorageError, False),
        (errno.ENAMETOOLONG, InvalidKey, False),
    ],
)
def test_os_errors_split_into_transient_and_permanent(
    code: int, kind: type[StorageError], transient: bool
) -> None:
    error = classify_os_error(OSError(code, os.strerror(code)), "k")
    assert type(error) is kind
    assert error.transient is transient
    assert error.key == "k"


def test_an_over_long_name_is_an_invalid_key(store: FsStore) -> None:
    with pytest.raises(InvalidKey):
        store.put("n" * 300, b"x")


def test_uri_is_an_absolute_percent_encoded_file_uri(store: FsStore, root: Path) -> None:
    assert store.uri("a b/c#1") == (root / "a b" / "c#1").as_uri()
    assert store.uri("a b/c#1").startswith("file:///")


@pytest.mark.parametrize("form", ["path", "file-uri", "relative"])
def test_open_store_builds_a_filesystem_store(
    root: Path, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root.parent)
    uri_root = {"path": str(root), "file-uri": root.as_uri(), "relative": root.name}[form]

    store = open_store(uri_root)
    store.put("k", b"x")

    assert isinstance(store, FsStore)
    assert (root / "k").read_bytes() == b"x"
    assert open_store(store.uri("k").removesuffix("/k")).read_bytes("k") == b"x"


def test_open_store_builds_an_s3_store_without_touching_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Credentials as a user has them: without any, boto3 would ask the EC2 metadata service.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    store = open_store("s3://bucket/some/prefix/", endpoint_url="http://127.0.0.1:9")
    assert isinstance(store, S3Store)
    assert store.uri("k") == "s3://bucket/some/prefix/k"


@pytest.mark.parametrize(
    ("uri_root", "options"),
    [
        ("gs://bucket/x", {}),
        ("file://otherhost/data", {}),
        ("/data", {"endpoint_url": "http://minio:9000"}),
        ("s3:///no-bucket", {}),
    ],
)
def test_open_store_rejects_what_it_cannot_honour(uri_root: str, options: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        open_store(uri_root, **options)  # type: ignore[arg-type]


def test_a_batch_fsyncs_each_folder_once_when_it_ends(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects written in a batch are durable and readable at once; their folders' entries are
    synced once per folder when the batch ends, not once per object."""
    from ckpt_ha.storage import fs_store

    synced: list[Path] = []
    real = fs_store.fsync

    def counting(path: Path) -> None:
        if path.is_dir():
            synced.append(path)
        real(path)

    monkeypatch.setattr(fs_store, "fsync", counting)
    store = FsStore(root)
    with store.folder_fsyncs_batched():
        for i in range(5):
            store.put(f"a/x{i}", b"data")
        with store.folder_fsyncs_batched():  # nested: the outer batch syncs
            store.put_if_absent("b/y", b"more")
        assert synced == []
        assert store.read_bytes("a/x3") == b"data"
    assert sorted(synced) == [root / "a", root / "b"]
    store.put("a/z", b"after")  # outside a batch: synced at once again
    assert synced[-1] == root / "a"


def test_a_batch_that_fails_ends_and_the_next_one_works(root: Path) -> None:
    store = FsStore(root)

    def failing_writer() -> None:
        with store.folder_fsyncs_batched():
            store.put("a/x", b"data")
            raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        failing_writer()
    with store.folder_fsyncs_batched():
        store.put("a/y", b"data")
    assert keys_of(store, "a/") == ["a/x", "a/y"]


def test_helper_threads_join_a_batch_and_their_folders_sync_once_with_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer using several threads (`sdk.save`'s leaves) still syncs each folder once."""
    import threading

    from ckpt_ha.storage import fs_store

    synced: list[Path] = []
    real = fs_store.fsync

    def counting(path: Path) -> None:
        if path.is_dir():
            synced.append(path)
        real(path)

    monkeypatch.setattr(fs_store, "fsync", counting)
    store = FsStore(root)

    def helper(join: Callable[[], AbstractContextManager[None]], i: int) -> None:
        with join():
            store.put(f"a/x{i}", b"data")
        store.put(f"c/x{i}", b"data")  # after leaving: synced at once, as outside a batch

    with store.folder_fsyncs_batched() as join:
        threads = [threading.Thread(target=helper, args=(join, i)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert synced == [root / "c"] * 3
    assert synced == [root / "c"] * 3 + [root / "a"]


def test_one_verification_still_looks_up_the_folder_and_its_files_every_time(
    tmp_path: Path,
) -> None:
    """`fs_read.ancestors_checked_once`: only the folders above the checkpoint's are trusted
    for the block; a link made inside it, or the folder itself swapped for a link meanwhile,
    is still refused on the next read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    folder = tmp_path / "root" / "checkpoint-1"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights")
    store = FsStore(folder)
    with ancestors_checked_once(str(store.root)):
        assert store.read_bytes("model.pt") == b"weights"
        (folder / "escape").symlink_to(outside)
        (folder / "linked.pt").symlink_to(outside / "secret")
        for key in ("escape/secret", "linked.pt"):
            with pytest.raises(InvalidKey, match="outside the store root"):
                store.read_bytes(key)
        folder.rename(tmp_path / "root" / "moved")
        folder.symlink_to(outside)
        with pytest.raises(InvalidKey, match="outside the store root"):
            store.read_bytes("secret")


def test_a_link_above_the_folder_is_never_trusted(tmp_path: Path) -> None:
    """Found at the start of the block, a link above the folder leaves every walk going from
    '/': nothing is skipped."""
    (tmp_path / "real" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    folder = str(tmp_path / "alias" / "checkpoint-1")
    with ancestors_checked_once(folder):
        assert through_link(f"{folder}/model.pt")
    with ancestors_checked_once(str(tmp_path / "real" / "checkpoint-1")):
        assert not through_link(str(tmp_path / "real" / "checkpoint-1" / "model.pt"))
        assert through_link(f"{folder}/model.pt")  # another path: walked from '/'
