"""Paths named inside a checkpoint (manifests, index files) must stay inside it."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import unquote

from ckpt_ha.storage.port import ObjectStore


def inside(relative: object) -> str | None:
    """The normalised relative path, or None when it is absolute, escapes, or is not a string."""
    if not isinstance(relative, str) or not relative or "\x00" in relative or "\\" in relative:
        return None
    path = PurePosixPath(relative)
    if path.is_absolute() or any(part in ("..", "") for part in path.parts):
        return None
    return str(path)


def join(prefix: str, relative: str) -> str:
    return f"{prefix.rstrip('/')}/{relative}" if prefix else relative


def folder_name(store: ObjectStore, prefix: str) -> str:
    """The checkpoint folder's own name, also when the store is rooted at it (prefix "")."""
    uri = store.uri(join(prefix, "x"))
    return unquote(uri.rsplit("/", 2)[-2]) if uri.count("/") >= 2 else ""
