"""Checkpoint storage: the ObjectStore port, its filesystem and S3 backends, and `open_store`."""

from __future__ import annotations

from pathlib import Path
from typing import Unpack
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
from ckpt_ha.storage.s3_store import S3Options, S3Store

__all__ = [
    "FsStore",
    "InvalidKey",
    "InvalidMetadata",
    "ListPage",
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
    "open_store",
    "validate_key",
    "validate_prefix",
]


def open_store(uri_root: str, **s3_options: Unpack[S3Options]) -> ObjectStore:
    """The store for `s3://bucket/prefix`, `file:///abs/path` or a plain path.

    S3 options are only meaningful for `s3://` roots; passing a non-None one with a filesystem
    root is a configuration mistake and raises ValueError rather than being ignored.
    """
    parts = urlsplit(uri_root)
    if parts.scheme == "s3":
        return S3Store(parts.netloc, parts.path, **s3_options)
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
    probe = store.uri("x")
    root = probe[: -len("x")]
    if not uri.startswith(root) or len(uri) == len(root):
        return None
    rest = uri[len(root) :].rstrip("/")
    return unquote(rest) if root.startswith("file:") else rest
