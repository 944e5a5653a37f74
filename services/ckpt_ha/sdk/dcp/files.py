"""Where DCP's files are: a filesystem folder (DCP reads and writes them itself), each data file
named after the rank that wrote it."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ckpt_ha.formats.dcp import DATA_SUFFIX
from ckpt_ha.storage import FsStore, open_store

_WRITTEN_BY = re.compile(r"^__(\d+)_\d+" + re.escape(DATA_SUFFIX) + "$")


class NeedsFilesystemRoot(ValueError):
    """DCP reads and writes files itself: the checkpoint must be on a filesystem path."""

    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(
            f"{where} is not a filesystem path: PyTorch DCP writes and reads its files through "
            "the local filesystem, so ckpt_ha.sdk.dcp needs a filesystem storage root (a shared "
            "filesystem when ranks run on several hosts; mount the bucket to use object storage)"
        )


def filesystem_store(root: str) -> FsStore:
    """The store at ``root``, which must be a filesystem path (`NeedsFilesystemRoot`)."""
    if urlsplit(root).scheme not in ("", "file"):
        raise NeedsFilesystemRoot(root)
    store = open_store(root)
    if not isinstance(store, FsStore):
        raise NeedsFilesystemRoot(root)
    return store


def written_by(name: str) -> int | None:
    """The rank that wrote a data file, as DCP's ``FileSystemWriter`` names them
    (``__<rank>_<n>.distcp``); None for any other name."""
    match = _WRITTEN_BY.match(name)
    return int(match.group(1)) if match is not None else None
