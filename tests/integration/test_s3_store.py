"""S3Store against a real S3-compatible HTTP server (moto): the shared contract, plus S3-only
concerns (bucket prefixes, foreign keys, transport and server failures)."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Iterator

import pytest
from botocore.config import Config
from botocore.exceptions import ConnectionClosedError
from mypy_boto3_s3 import S3Client

from ckpt_ha.storage import (
    ObjectExists,
    ObjectStore,
    S3Store,
    StorageError,
    StorageUnavailable,
    open_store,
)
from tests.support.lossy_link import LossyLink
from tests.support.moto_server import (
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    s3_client,
    start_moto_server,
)
from tests.support.store_contract import StoreContract, keys_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    endpoint, stop = start_moto_server()
    yield endpoint
    stop()


@pytest.fixture(scope="module")
def raw_client(s3_endpoint: str) -> S3Client:
    return s3_client(s3_endpoint)


@pytest.fixture
def bucket(raw_client: S3Client) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:16]}"
    raw_client.create_bucket(Bucket=name)
    return name


def make_store(endpoint: str, bucket: str, prefix: str = "") -> S3Store:
    return S3Store(
        bucket,
        prefix,
        endpoint_url=endpoint,
        access_key=FAKE_ACCESS_KEY,
        secret_key=FAKE_SECRET_KEY,
    )


class TestS3StoreContract(StoreContract):
    @pytest.fixture
    def store(self, raw_client: S3Client, bucket: str) -> ObjectStore:
        # A shared client keeps the suite fast; the tests below build their own clients.
        return S3Store(bucket, prefix="team/ckpts", client=raw_client)


class TestS3StoreContractWithMultipartCopies(StoreContract):
    """The same contract with every copy and move of a non-empty object going in parts."""

    @pytest.fixture
    def store(self, raw_client: S3Client, bucket: str) -> ObjectStore:
        return S3Store(bucket, prefix="team/ckpts", client=raw_client, multipart_copy_threshold=1)


def test_keys_live_under_the_prefix_and_stores_do_not_see_each_other(
    s3_endpoint: str, bucket: str, raw_client: S3Client
) -> None:
    team_a = make_store(s3_endpoint, bucket, "/team-a/")
    team_b = make_store(s3_endpoint, bucket, "team-b")
    whole = make_store(s3_endpoint, bucket)

    team_a.put("step-1/shard", b"a")

    raw = raw_client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [item["Key"] for item in raw] == ["team-a/step-1/shard"]
    assert keys_of(team_a) == ["step-1/shard"]
    assert keys_of(team_b) == []
    assert keys_of(whole) == ["team-a/step-1/shard"]
    assert team_a.uri("step-1/shard") == f"s3://{bucket}/team-a/step-1/shard"
    assert whole.uri("k") == f"s3://{bucket}/k"


def test_listing_skips_keys_the_store_could_not_have_written(
    s3_endpoint: str, bucket: str, raw_client: S3Client
) -> None:
    for key in ["p/", "p/dir/", "p/a//b", "p/ok-1", "p/./x", "p/ok-2"]:
        raw_client.put_object(Bucket=bucket, Key=key, Body=b"")
    store = make_store(s3_endpoint, bucket, "p")

    assert keys_of(store) == ["ok-1", "ok-2"]
    assert keys_of(store, page_size=1) == ["ok-1", "ok-2"]

    # Pages may come back short (even empty) but the cursor still walks to the end.
    seen: list[str] = []
    page = store.list_page(page_size=1)
    for _ in range(10):
        seen += [info.key for info in page.items]
        if page.next_cursor is None:
            break
        page = store.list_page(cursor=page.next_cursor, page_size=1)
    assert seen == ["ok-1", "ok-2"]
    assert page.next_cursor is None


def test_open_store_reaches_the_bucket(s3_endpoint: str, bucket: str) -> None:
    store = open_store(
        f"s3://{bucket}/runs/7",
        endpoint_url=s3_endpoint,
        access_key=FAKE_ACCESS_KEY,
        secret_key=FAKE_SECRET_KEY,
    )
    store.put("manifest.json", b"{}")
    assert make_store(s3_endpoint, bucket).read_bytes("runs/7/manifest.json") == b"{}"


def test_a_missing_bucket_is_a_permanent_error(s3_endpoint: str) -> None:
    store = make_store(s3_endpoint, f"missing-{uuid.uuid4().hex[:12]}")
    with pytest.raises(StorageError, match="NoSuchBucket") as caught:
        store.list_page()
    assert not caught.value.transient


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_endpoint_is_transient(closed_port: int) -> None:
    client = s3_client(
        f"http://127.0.0.1:{closed_port}",
        Config(retries={"max_attempts": 1}, connect_timeout=0.5, read_timeout=0.5),
    )
    store = S3Store("bucket", client=client)

    for operation in (
        lambda: store.stat("k"),
        lambda: store.read_bytes("k"),
        lambda: store.put("k", b"x"),
        lambda: store.put_if_absent("k", b"x"),
        lambda: store.delete("k"),
        lambda: store.list_page(),
        lambda: list(store.list()),
    ):
        with pytest.raises(StorageUnavailable) as caught:
            operation()
        assert caught.value.transient
        assert caught.value.backend == "s3"


def test_quarantine_and_restore_a_checkpoint_folder_on_s3(s3_endpoint: str, bucket: str) -> None:
    from ckpt_ha.storage.quarantine import quarantine, restore

    store = make_store(s3_endpoint, bucket, "root")
    store.put("job-1/step-5/a.bin", b"a", metadata={"sha256": "ab"})
    store.put("job-1/step-5/ckpt-ha.manifest.json", b"{}")

    target = quarantine(store, "job-1/step-5", "job-1", "job-1-c1")

    assert target == "quarantine/job-1/job-1-c1"
    assert keys_of(store) == [f"{target}/a.bin", f"{target}/ckpt-ha.manifest.json"]
    assert store.stat(f"{target}/a.bin").metadata == {"sha256": "ab"}
    assert store.uri(target) == f"s3://{bucket}/root/{target}"
    restore(store, target, "job-1/step-5")
    assert keys_of(store) == ["job-1/step-5/a.bin", "job-1/step-5/ckpt-ha.manifest.json"]


def test_a_create_only_put_whose_answer_was_lost_recognises_its_own_write(
    s3_endpoint: str, bucket: str
) -> None:
    host, port = s3_endpoint.removeprefix("http://").split(":")
    with LossyLink((host, int(port))) as link:
        store = make_store(link.url, bucket, "runs")
        # The PUT lands, its answer is lost, botocore sends it again and meets If-None-Match.
        info = store.put_if_absent("manifest.json", b"claim", metadata={"writer": "a"})
        assert link.dropped == 1

    assert info.size == len(b"claim")
    reader = make_store(s3_endpoint, bucket, "runs")
    assert reader.read_bytes("manifest.json") == b"claim"
    assert reader.stat("manifest.json").metadata == {"writer": "a"}
    # Another writer, even with the same bytes and metadata, still finds the key taken.
    with pytest.raises(ObjectExists):
        reader.put_if_absent("manifest.json", b"claim", metadata={"writer": "a"})


PART = 5 * 1024 * 1024  # the smallest part S3 (and moto) accept, except the last


def large_object_store(endpoint: str, bucket: str, client: S3Client | None = None) -> S3Store:
    return S3Store(
        bucket,
        "big",
        client=client,
        endpoint_url=endpoint,
        access_key=FAKE_ACCESS_KEY,
        secret_key=FAKE_SECRET_KEY,
        multipart_copy_threshold=PART,
        multipart_part_size=PART,
    )


def test_an_object_over_the_threshold_is_copied_and_moved_in_parts(
    s3_endpoint: str, bucket: str, raw_client: S3Client
) -> None:
    store = large_object_store(s3_endpoint, bucket)
    data = os.urandom(2 * PART + 12345)  # two whole parts and a short last one
    digest = hashlib.sha256(data).hexdigest()
    store.put("src.bin", data, metadata={"sha256": digest})
    store.put("small.bin", b"x" * PART)  # at the threshold: one CopyObject

    copied = store.copy("src.bin", "copy.bin")
    moved = store.move("copy.bin", "moved.bin")
    small = store.copy("small.bin", "small-copy.bin")

    # A completed multipart upload's ETag ends in its part count; a CopyObject's does not.
    assert str(copied.etag).endswith("-3")
    assert str(moved.etag).endswith("-3")
    assert "-" not in str(small.etag)
    for key in ("src.bin", "moved.bin"):
        assert hashlib.sha256(store.read_bytes(key)).hexdigest() == digest
        assert store.stat(key).metadata == {"sha256": digest}
    assert (moved.size, moved.metadata) == (len(data), {"sha256": digest})
    assert keys_of(store) == ["moved.bin", "small-copy.bin", "small.bin", "src.bin"]
    assert raw_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_multipart_move_that_fails_midway_keeps_the_source_and_leaves_no_upload(
    s3_endpoint: str, bucket: str, raw_client: S3Client
) -> None:
    client = s3_client(s3_endpoint, Config(retries={"max_attempts": 1}))
    store = large_object_store(s3_endpoint, bucket, client)
    data = os.urandom(2 * PART + 1)
    store.put("src.bin", data, metadata={"sha256": "ab"})
    store.put("dst.bin", b"old", metadata={"stale": "yes"})
    copied_parts: list[int] = []

    def lose_the_second_part(params: dict[str, object], **_: object) -> None:
        part = int(str(params["PartNumber"]))
        if part == 2:
            raise ConnectionClosedError(endpoint_url=s3_endpoint)
        copied_parts.append(part)

    client.meta.events.register("before-parameter-build.s3.UploadPartCopy", lose_the_second_part)

    with pytest.raises(StorageUnavailable):
        store.move("src.bin", "dst.bin")

    assert copied_parts == [1]
    assert store.read_bytes("src.bin") == data
    assert store.stat("src.bin").metadata == {"sha256": "ab"}
    assert store.read_bytes("dst.bin") == b"old"  # untouched until the upload completes
    assert raw_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

    client.meta.events.unregister("before-parameter-build.s3.UploadPartCopy", lose_the_second_part)
    store.move("src.bin", "dst.bin")  # repeating the move finishes it
    assert store.read_bytes("dst.bin") == data
    assert not store.exists("src.bin")


def test_part_sizes_s3_would_refuse_are_rejected_up_front() -> None:
    with pytest.raises(ValueError, match="multipart_part_size"):
        S3Store("bucket", multipart_part_size=PART - 1)
    with pytest.raises(ValueError, match="multipart_copy_threshold"):
        S3Store("bucket", multipart_copy_threshold=6 * 1024**3)
