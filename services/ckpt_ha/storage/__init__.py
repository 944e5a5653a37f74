"""Checkpoint storage: the ObjectStore port, its filesystem and S3 backends, and `open_store`.

The S3 backend (and boto3 with it) is imported only when it is used: an `s3://` root is opened,
or `S3Store` / `S3Options` is imported from here. A training process on a filesystem needs no
boto3 (it is the `s3` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack
from urllib.parse import unquote, urlsplit

from ckpt_ha.storage.errors import (
    InvalidKey,
    InvalidMetadata,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from ckpt_ha.storage.fs_store import FsStore
from ckpt_ha.storage.port import (
    ListPage,
    ObjectInfo,
    ObjectStore,
    ReadStream,
    validate_key,
    validate_prefix,
)

if TYPE_CHECKING:
    from ckpt_ha.storage.s3_store import S3Options, S3Store

__all__ = [
    "FsStore",
    "InvalidKey",
    "InvalidMetadata",
    "ListPage",
    "NeedsS3Extra",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ReadStream",
    "S3Options",
    "S3Store",
    "StorageError",
    "StorageUnavailable",
    "key_for_uri",
    "keys_in",
    "open_store",
    "validate_key",
    "validate_prefix",
]


class NeedsS3Extra(ImportError):
    """An `s3://` root was opened where boto3 is not installed."""

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"s3:// storage needs {missing}, which is not installed: pip install 'ckpt-ha[s3]'",
            name=missing,
        )


def _s3_store() -> type[S3Store]:
    try:
        from ckpt_ha.storage.s3_store import S3Store
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("boto3", "botocore"):
            raise
        raise NeedsS3Extra(exc.name.split(".")[0]) from exc
    return S3Store


def __getattr__(name: str) -> Any:
    """`S3Store` and `S3Options`, imported on first use (PEP 562)."""
    if name == "S3Store":
        return _s3_store()
    if name == "S3Options":
        _s3_store()
        from ckpt_ha.storage.s3_store import S3Options

        return S3Options
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(uri_root: str, **s3_options: Unpack[S3Options]) -> ObjectStore:
    """The store for `s3://bucket/prefix`, `file:///abs/path` or a plain path.

    S3 options are only meaningful for `s3://` roots; passing a non-None one with a filesystem
    root is a configuration mistake and raises ValueError rather than being ignored.
    """
    parts = urlsplit(uri_root)
    if parts.scheme == "s3":
        return _s3_store()(parts.netloc, parts.path, **s3_options)
    if parts.scheme not in ("", "file"):
        raise ValueError(f"unsupported storage URI scheme {parts.scheme!r} in {uri_root!r}")
    given = sorted(name for name, value in s3_options.items() if value is not None)
    if given:
        raise ValueError(f"S3 options {given} given for filesystem root {uri_root!r}")
    if parts.scheme == "":
        return FsStore(Path(uri_root))
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file URI {uri_root!r} names a remote host")
    return FsStore(Path(unquote(parts.path)))


def key_for_uri(store: ObjectStore, uri: str) -> str | None:
    """Inverse of `ObjectStore.uri`: the key ``uri`` names in ``store``, or None if outside it."""
    return keys_in(store)(uri)


def keys_in(store: ObjectStore) -> Callable[[str], str | None]:
    """`key_for_uri` for one store, its root's URI worked out once: for a consumer that maps
    every event's location. A filesystem root's prefix is the one it computed once (a probe
    `uri` would resolve a path, a few ``lstat`` calls on the event loop)."""
    root = store.uri_root if isinstance(store, FsStore) else store.uri("x")[: -len("x")]
    quoted = root.startswith("file:")

    def key_of(uri: str) -> str | None:
        if not uri.startswith(root) or len(uri) == len(root):
            return None
        rest = uri[len(root) :].rstrip("/")
        return unquote(rest) if quoted else rest

    return key_of
