"""Offline verdicts on checkpoint folders, without the stack: one checkpoint's verdict, and the
newest valid checkpoint under a run's root with why each newer one was rejected. A location is
a local path or an `s3://bucket/prefix` URI (endpoint and credentials from the standard AWS
variables)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from threading import Lock
from typing import Any

from ckpt_ha.formats import Report, latest_valid, verify, verify_file, verify_path
from ckpt_ha.formats.checksum import observe_reads
from ckpt_ha.storage import FsStore, ObjectStore, open_store


class NothingThere(LookupError):
    """The location holds no checkpoint folder or file at all (a usage error, not a verdict)."""

    def __init__(self, location: str, what: str) -> None:
        super().__init__(f"{location}: {what}")


Progress = Callable[[int, int | None], None]
"""``(done, total)`` of long work, total None while unknown: bytes read by `verify_location`,
folders checked by `newest_valid`. Called from several threads."""


def is_remote(location: str) -> bool:
    return location.startswith("s3://")


@dataclass(frozen=True)
class Rejected:
    path: str
    report: Report

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "step": self.report.step,
            "verdict": self.report.verdict.value,
            "reasons": self.report.reasons[:5],
        }


@dataclass(frozen=True)
class LatestValid:
    root: str
    path: str | None
    """None: no valid checkpoint under the root."""
    report: Report | None
    rejected: list[Rejected]
    """Newer than the chosen one (or every one, when none is valid), newest first."""


def verify_location(location: str, algorithm: str, progress: Progress | None = None) -> Report:
    """The verdict for a checkpoint folder or single file; raises NothingThere if the location
    holds neither, and StorageError if S3 cannot be read. ``progress``: bytes read of the
    location's total size."""
    if not is_remote(location):
        path = Path(location)
        if not path.exists():
            raise NothingThere(location, "no such file or directory")
        with _reads(progress, lambda: _local_size(path)):
            return verify_path(path, algorithm)
    folder = open_store(location)
    if _holds_anything(folder):
        with _reads(progress, lambda: sum(i.size for i in folder.list(""))):
            return verify(folder, "", algorithm)
    parent, _, name = location.rstrip("/").rpartition("/")
    if parent.count("/") >= 3:  # s3://bucket/name at least: a file may sit there
        store = open_store(parent)
        if store.exists(name):
            with _reads(progress, lambda: sum(i.size for i in store.list(name) if i.key == name)):
                return verify_file(store, name, algorithm)
    raise NothingThere(location, "no such object or prefix")


def _reads(progress: Progress | None, total: Callable[[], int]) -> AbstractContextManager[None]:
    """Reports every byte the checksums read against ``total()`` (listed only when asked)."""
    if progress is None:
        return nullcontext()
    size = total()
    done = 0
    lock = Lock()
    progress(0, size)

    def seen(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            now = done
        progress(now, size)

    return observe_reads(seen)


def _local_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def newest_valid(root: str | Path, progress: Progress | None = None) -> LatestValid:
    """Raises NothingThere for a missing local directory or an empty S3 prefix. ``progress``:
    checkpoint folders checked of those under the root."""
    location = str(root)
    store: ObjectStore
    if is_remote(location):
        store = open_store(location)
        if not _holds_anything(store):
            raise NothingThere(location, "nothing stored under this prefix")
        base = location.rstrip("/") + "/"
    else:
        if not Path(location).is_dir():
            raise NothingThere(location, "not a directory")
        store = FsStore(Path(location))
        base = str(Path(location)) + "/"
    chosen, reports = latest_valid(store, on_checked=progress)
    rejected: list[Rejected] = []
    for folder, report in reports:
        if folder == chosen:
            break
        rejected.append(Rejected(base + folder, report))
    chosen_report = dict(reports).get(chosen) if chosen else None
    return LatestValid(location, base + chosen if chosen else None, chosen_report, rejected)


def _holds_anything(store: ObjectStore) -> bool:
    return bool(store.list_page(page_size=1).items)
