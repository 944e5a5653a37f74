"""ObjectStore on S3 or an S3-compatible server (MinIO, Ceph RGW, moto).

Atomic publication is S3's own: an object appears whole or not at all, with its metadata.
Create-only writes use a conditional PUT (`If-None-Match: *`). Keys live under an optional
prefix inside the bucket; listings strip it again and skip keys that are not valid store keys
(console "folder" markers like `dir/`, `a//b`), so both backends list the same things.

A copy (and so a move) of an object over the multipart threshold (5 GiB, the most one CopyObject
may copy) is a multipart copy: the server copies byte ranges of the source into parts of a new
upload, pinned to the source's ETag, and the new object appears only when the upload completes.
`put` is a single request, so objects written through the store are capped at 5 GiB.

A create-only put carries a random token in a reserved metadata entry. If its answer is lost
and botocore sends it again, the server says "precondition failed" about the object the first
attempt wrote; the store recognises its own token and reports success instead of
`ObjectExists`. `stat` hides the entry.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, Self, TypedDict

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
)

from ckpt_ha.storage.errors import (
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from ckpt_ha.storage.port import (
    CREATE_ID_METADATA,
    MAX_METADATA_BYTES,
    ListPage,
    ObjectInfo,
    ObjectStore,
    ReadStream,
    validate_key,
    validate_metadata,
    validate_page_size,
    validate_prefix,
    validate_range,
)

if TYPE_CHECKING:
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import (
        CompletedPartTypeDef,
        CopySourceTypeDef,
        HeadObjectOutputTypeDef,
        ListObjectsV2OutputTypeDef,
        ListObjectsV2RequestTypeDef,
        PutObjectRequestTypeDef,
    )

BACKEND = "s3"
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_CONDITION_CODES = frozenset({"PreconditionFailed", "412"})
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "409"})
_THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout"})
_TRANSPORT_ERRORS = (ConnectionError, HTTPClientError, IncompleteReadError)


CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
"""Bound on each wait for bytes from the server (not on a whole transfer)."""
MAX_ATTEMPTS = 3
"""Attempts per request, retried with botocore's backoff on transport errors, throttling and
5xx; after the last, a transient error is `StorageUnavailable`."""

MiB = 1024 * 1024
MULTIPART_COPY_THRESHOLD = 5 * 1024 * MiB
"""Objects larger than this are copied in parts: a single CopyObject copies at most 5 GiB."""
MULTIPART_PART_SIZE = 512 * MiB
"""Bytes per part of a multipart copy (grown if the object would need over 10,000 parts)."""
MIN_PART_SIZE = 5 * MiB
"""S3's smallest part (except the last): a smaller part size is refused up front."""
MAX_PARTS = 10_000


class S3Options(TypedDict, total=False):
    """Keyword options `S3Store` (and `open_store` for `s3://` roots) accept."""

    client: S3Client | None
    endpoint_url: str | None
    region_name: str
    access_key: str | None
    secret_key: str | None
    connect_timeout_s: float | None
    read_timeout_s: float | None
    max_attempts: int | None
    multipart_copy_threshold: int | None
    multipart_part_size: int | None


def _error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def classify_boto_error(err: BotoCoreError | ClientError, key: str | None = None) -> StorageError:
    """Missing keys are ObjectNotFound; transport failures, throttling and 5xx are transient;
    anything else (access denied, no such bucket, bad credentials) is permanent."""
    if isinstance(err, ClientError):
        code = _error_code(err)
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if key is not None and code in _NOT_FOUND_CODES:
            return ObjectNotFound(key, backend=BACKEND)
        if status >= 500 or code in _THROTTLE_CODES:
            return StorageUnavailable(reason=f"{code} (HTTP {status})", backend=BACKEND, key=key)
        return StorageError(reason=f"{code} (HTTP {status})", backend=BACKEND, key=key)
    if isinstance(err, _TRANSPORT_ERRORS):
        return StorageUnavailable(reason=str(err), backend=BACKEND, key=key)
    return StorageError(reason=str(err), backend=BACKEND, key=key)


_CREATE_ID_SIZE = len(CREATE_ID_METADATA) + 32


def _metadata_size(metadata: Mapping[str, str]) -> int:
    return sum(len(name) + len(value) for name, value in metadata.items())


def _etag(value: str | None) -> str | None:
    return value.strip('"') if value else None


class _BodyStream:
    """A GetObject body whose transport errors surface as StorageErrors."""

    def __init__(self, body: StreamingBody, key: str) -> None:
        self._body = body
        self._key = key

    def read(self, size: int = -1, /) -> bytes:
        try:
            return self._body.read(None if size < 0 else size)
        except BotoCoreError as err:
            raise classify_boto_error(err, self._key) from err

    def close(self) -> None:
        self._body.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class S3Store(ObjectStore):
    """ObjectStore over `s3://bucket/prefix/`. Builds no client and opens no connection until
    first used; pass `client` to share one (boto3 clients are thread-safe). Every request is
    bounded: ``connect_timeout_s`` to connect, ``read_timeout_s`` per wait for data, at most
    ``max_attempts`` attempts (defaults above). Copies of objects over
    ``multipart_copy_threshold`` bytes go in parts of ``multipart_part_size`` bytes."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: S3Client | None = None,
        endpoint_url: str | None = None,
        region_name: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        max_attempts: int | None = None,
        multipart_copy_threshold: int | None = None,
        multipart_part_size: int | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("an S3 store needs a bucket name")
        self._multipart_threshold = multipart_copy_threshold or MULTIPART_COPY_THRESHOLD
        self._part_size = multipart_part_size or MULTIPART_PART_SIZE
        if not MIN_PART_SIZE <= self._part_size <= MULTIPART_COPY_THRESHOLD:
            raise ValueError(
                f"multipart_part_size must be within {MIN_PART_SIZE}..{MULTIPART_COPY_THRESHOLD}"
                f" bytes, got {self._part_size}"
            )
        if not 0 < self._multipart_threshold <= MULTIPART_COPY_THRESHOLD:
            raise ValueError(
                f"multipart_copy_threshold must be within 1..{MULTIPART_COPY_THRESHOLD} bytes,"
                f" got {self._multipart_threshold}"
            )
        root = prefix.strip("/")
        self._bucket = bucket
        self._prefix = validate_key(root) + "/" if root else ""
        self._client = client or boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region_name,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=Config(
                retries={"max_attempts": max_attempts or MAX_ATTEMPTS, "mode": "standard"},
                connect_timeout=connect_timeout_s or CONNECT_TIMEOUT_S,
                read_timeout=read_timeout_s or READ_TIMEOUT_S,
                # S3-compatible servers rarely have wildcard DNS for virtual-host buckets.
                s3={"addressing_style": "path" if endpoint_url else "auto"},
            ),
        )

    def __repr__(self) -> str:
        return f"S3Store('s3://{self._bucket}/{self._prefix}')"

    def list(
        self, prefix: str = "", *, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        validate_page_size(page_size)
        return self._list_all(prefix, start_after, page_size)

    def list_page(
        self, prefix: str = "", *, cursor: str | None = None, page_size: int = 1000
    ) -> ListPage:
        validate_prefix(prefix)
        validate_page_size(page_size)
        response = self._list_request(prefix, start_after=cursor, token=None, page_size=page_size)
        contents = response.get("Contents", [])
        last = contents[-1]["Key"][len(self._prefix) :] if contents else None
        return ListPage(
            items=tuple(self._objects(response)),
            next_cursor=last if response.get("IsTruncated") else None,
        )

    def stat(self, key: str) -> ObjectInfo:
        head = self._head(key)
        metadata = dict(head.get("Metadata", {}))
        metadata.pop(CREATE_ID_METADATA, None)
        return ObjectInfo(
            key=key,
            size=head["ContentLength"],
            mtime=head["LastModified"].astimezone(UTC),
            etag=_etag(head.get("ETag")),
            metadata=metadata,
        )

    def _head(self, key: str) -> HeadObjectOutputTypeDef:
        try:
            return self._client.head_object(Bucket=self._bucket, Key=self._full_key(key))
        except (BotoCoreError, ClientError) as err:
            raise classify_boto_error(err, key) from err

    def open_read(self, key: str, *, offset: int = 0, length: int | None = None) -> ReadStream:
        validate_range(offset, length)
        full = self._full_key(key)
        if length == 0:  # an HTTP range cannot be empty
            self.stat(key)
            return io.BytesIO()
        last = "" if length is None else str(offset + length - 1)
        try:
            response = self._client.get_object(
                Bucket=self._bucket, Key=full, Range=f"bytes={offset}-{last}"
            )
        except ClientError as err:
            if _error_code(err) == "InvalidRange":  # offset at or past the end (or empty object)
                return io.BytesIO()
            raise classify_boto_error(err, key) from err
        except BotoCoreError as err:
            raise classify_boto_error(err, key) from err
        return _BodyStream(response["Body"], key)

    def put(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return self._put(key, data, metadata, create_only=False)

    def put_if_absent(
        self, key: str, data: bytes | BinaryIO, *, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return self._put(key, data, metadata, create_only=True)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        if src_key == dst_key:
            raise InvalidKey(dst_key, reason="copy onto itself", backend=BACKEND)
        source: CopySourceTypeDef = {"Bucket": self._bucket, "Key": self._full_key(src_key)}
        head = self._head(src_key)
        if head["ContentLength"] > self._multipart_threshold:
            self._multipart_copy(source, head, src_key, dst_key)
            return self.stat(dst_key)
        try:
            self._client.copy_object(
                Bucket=self._bucket,
                Key=self._full_key(dst_key),
                CopySource=source,
                MetadataDirective="COPY",
            )
        except (BotoCoreError, ClientError) as err:
            raise classify_boto_error(err, src_key) from err
        return self.stat(dst_key)

    def _multipart_copy(
        self, source: CopySourceTypeDef, head: HeadObjectOutputTypeDef, src_key: str, dst_key: str
    ) -> None:
        """Copy `source` into `dst_key` part by part (UploadPartCopy with byte ranges), each part
        pinned to the source's ETag so a source replaced mid-copy fails the copy instead of
        mixing versions. `dst_key` changes only when the upload completes; a failed copy aborts
        the upload so no parts are left billed."""
        size = head["ContentLength"]
        part_size = max(self._part_size, -(-size // MAX_PARTS))
        dst = self._full_key(dst_key)
        try:
            upload_id = self._client.create_multipart_upload(
                Bucket=self._bucket, Key=dst, Metadata=dict(head.get("Metadata", {}))
            )["UploadId"]
        except (BotoCoreError, ClientError) as err:
            raise classify_boto_error(err, dst_key) from err
        try:
            parts: list[CompletedPartTypeDef] = []
            for number, start in enumerate(range(0, size, part_size), start=1):
                end = min(start + part_size, size) - 1
                part = self._client.upload_part_copy(
                    Bucket=self._bucket,
                    Key=dst,
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource=source,
                    CopySourceRange=f"bytes={start}-{end}",
                    CopySourceIfMatch=head["ETag"],
                )
                parts.append({"PartNumber": number, "ETag": part["CopyPartResult"]["ETag"]})
            self._client.complete_multipart_upload(
                Bucket=self._bucket, Key=dst, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException as exc:
            # If the abort fails too, the bucket's rule for incomplete uploads is the backstop.
            with contextlib.suppress(BotoCoreError, ClientError):
                self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=dst, UploadId=upload_id
                )
            if isinstance(exc, ClientError) and _error_code(exc) in _CONDITION_CODES:
                raise StorageUnavailable(
                    reason="source changed during a multipart copy", backend=BACKEND, key=src_key
                ) from exc
            if isinstance(exc, (BotoCoreError, ClientError)):
                raise classify_boto_error(exc, src_key) from exc
            raise

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self._bucket, Key=self._full_key(key))
        except (BotoCoreError, ClientError) as err:
            raise classify_boto_error(err, key) from err

    def uri(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._full_key(key)}"

    def _full_key(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def _put(
        self,
        key: str,
        data: bytes | BinaryIO,
        metadata: Mapping[str, str] | None,
        *,
        create_only: bool,
    ) -> ObjectInfo:
        checked = validate_metadata(metadata, key=key)
        token = uuid.uuid4().hex if create_only else None
        if token is not None and _metadata_size(checked) + _CREATE_ID_SIZE <= MAX_METADATA_BYTES:
            checked[CREATE_ID_METADATA] = token
        else:
            token = None  # no room: a lost answer then reads as ObjectExists
        request: PutObjectRequestTypeDef = {
            "Bucket": self._bucket,
            "Key": self._full_key(key),
            "Body": data,
            "Metadata": checked,
        }
        if create_only:
            request["IfNoneMatch"] = "*"
        try:
            self._client.put_object(**request)
        except ClientError as err:
            if create_only and _error_code(err) in _CONDITION_CODES:
                if not self._written_by(key, token):
                    raise ObjectExists(key, backend=BACKEND) from err
            elif create_only and _error_code(err) in _CONFLICT_CODES:
                if not self._written_by(key, token):
                    raise self._lost_race(key) from err
            else:
                raise classify_boto_error(err, key) from err
        except BotoCoreError as err:
            raise classify_boto_error(err, key) from err
        return self.stat(key)

    def _written_by(self, key: str, token: str | None) -> bool:
        """Whether the object at `key` is the one this create-only put (its `token`) wrote: an
        earlier attempt whose answer was lost before botocore retried it."""
        if token is None:
            return False
        try:
            head = self._head(key)
        except ObjectNotFound:
            return False
        return head.get("Metadata", {}).get(CREATE_ID_METADATA) == token

    def _lost_race(self, key: str) -> StorageError:
        """409 ConditionalRequestConflict: a concurrent write or delete of the key overlapped
        ours. AWS says retry; if the other writer has already landed, the answer is known."""
        if self.exists(key):
            return ObjectExists(key, backend=BACKEND)
        return StorageUnavailable(reason="concurrent write conflict", backend=BACKEND, key=key)

    def _list_all(
        self, prefix: str, start_after: str | None, page_size: int
    ) -> Iterator[ObjectInfo]:
        token: str | None = None
        while True:
            response = self._list_request(
                prefix, start_after=start_after, token=token, page_size=page_size
            )
            yield from self._objects(response)
            if not response.get("IsTruncated"):
                return
            token = response["NextContinuationToken"]

    def _list_request(
        self, prefix: str, *, start_after: str | None, token: str | None, page_size: int
    ) -> ListObjectsV2OutputTypeDef:
        request: ListObjectsV2RequestTypeDef = {
            "Bucket": self._bucket,
            "Prefix": self._prefix + prefix,
            "MaxKeys": page_size,
        }
        if start_after is not None:
            request["StartAfter"] = self._prefix + start_after
        if token is not None:
            request["ContinuationToken"] = token
        try:
            return self._client.list_objects_v2(**request)
        except (BotoCoreError, ClientError) as err:
            raise classify_boto_error(err) from err

    def _objects(self, response: ListObjectsV2OutputTypeDef) -> Iterator[ObjectInfo]:
        for item in response.get("Contents", []):
            key = item["Key"][len(self._prefix) :]
            try:
                validate_key(key)
            except InvalidKey:
                continue  # not something this store could have written
            yield ObjectInfo(
                key=key,
                size=item["Size"],
                mtime=item["LastModified"].astimezone(UTC),
                etag=_etag(item.get("ETag")),
            )
