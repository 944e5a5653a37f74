"""Offline verdicts on checkpoint folders, without the stack: one checkpoint's verdict, and the
newest valid checkpoint under a run's root with why each newer one was rejected. A location is
a local path or an `s3://bucket/prefix` URI (endpoint and credentials from the standard AWS
variables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_ha.formats import Report, latest_valid, verify, verify_file, verify_path
from ckpt_ha.storage import FsStore, ObjectStore, open_store


class NothingThere(LookupError):
    """The location holds no checkpoint folder or file at all (a usage error, not a verdict)."""

    def __init__(self, location: str, what: str) -> None:
        super().__init__(f"{location}: {what}")


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


def verify_location(location: str, algorithm: str) -> Report:
    """The verdict for a checkpoint folder or single file; raises NothingThere if the location
    holds neither, and StorageError if S3 cannot be read."""
    if not is_remote(location):
        path = Path(location)
        if not path.exists():
            raise NothingThere(location, "no such file or directory")
        return verify_path(path, algorithm)
    folder = open_store(location)
    if _holds_anything(folder):
        return verify(folder, "", algorithm)
    parent, _, name = location.rstrip("/").rpartition("/")
    if parent.count("/") >= 3:  # s3://bucket/name at least: a file may sit there
        store = open_store(parent)
        if store.exists(name):
            return verify_file(store, name, algorithm)
    raise NothingThere(location, "no such object or prefix")


def newest_valid(root: str | Path) -> LatestValid:
    """Raises NothingThere for a missing local directory or an empty S3 prefix."""
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
    chosen, reports = latest_valid(store)
    rejected: list[Rejected] = []
    for folder, report in reports:
        if folder == chosen:
            break
        rejected.append(Rejected(base + folder, report))
    chosen_report = dict(reports).get(chosen) if chosen else None
    return LatestValid(location, base + chosen if chosen else None, chosen_report, rejected)


def _holds_anything(store: ObjectStore) -> bool:
    return bool(store.list_page(page_size=1).items)
