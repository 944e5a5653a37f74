"""Paths named inside a checkpoint (manifests, index files) must stay inside it, and so must
every file read through it (`confine`)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import PurePosixPath
from urllib.parse import unquote

from ckpt_ha.storage.errors import InvalidKey
from ckpt_ha.storage.fs_read import ancestors_checked_once, real_path
from ckpt_ha.storage.fs_store import FsStore
from ckpt_ha.storage.port import ObjectStore
from ckpt_ha.storage.read_budget import BudgetedStore


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
    if isinstance(store, FsStore):  # what its `uri` names, without resolving a path for it
        return (store.root / prefix).name
    uri = store.uri(join(prefix, "x"))
    return unquote(uri.rsplit("/", 2)[-2]) if uri.count("/") >= 2 else ""


def confine(store: ObjectStore, prefix: str) -> tuple[ObjectStore, str]:
    """The store and prefix to read the checkpoint folder at ``prefix`` through, so that nothing
    read leaves that folder: on a filesystem, a store rooted at the folder itself. A symlink
    out of the folder (into another job's checkpoint, say) is then refused (`InvalidKey`, which
    the readers report as unsafe) as it is by ``ckpt-ha verify``, instead of being followed
    anywhere under the storage root. A folder reached through a symlink raises `InvalidKey`.
    Object stores have no links: they are returned as they are. A `BudgetedStore` is confined
    underneath and keeps its read budget.
    """
    if isinstance(store, BudgetedStore):
        inner, prefix = confine(store.inner, prefix)
        return store.over(inner), prefix
    if not prefix or not isinstance(store, FsStore):
        return store, prefix
    folder = store.root / prefix
    if real_path(folder) != folder:
        raise InvalidKey(prefix, reason="the checkpoint folder is reached through a symlink")
    if not folder.is_dir():  # nothing there (yet): read as before, it lists empty
        return store, prefix
    return FsStore.at_real_path(folder), ""


def one_reading(store: ObjectStore) -> AbstractContextManager[None]:
    """Around one verification of a folder `confine` returned: on a filesystem, the folders
    above the checkpoint's are looked up for links once for the block, not on each of its
    reads (`fs_read.ancestors_checked_once`; the folder and its files still are, every time).
    Object stores have no links: nothing to do."""
    if isinstance(store, BudgetedStore):
        return one_reading(store.inner)
    if isinstance(store, FsStore):
        return ancestors_checked_once(str(store.root))
    return contextlib.nullcontext()
