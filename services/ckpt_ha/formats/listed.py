"""Files a commit record lists with size and checksum (the native manifest, the ckpt-ha commit
sidecar): each must be inside the checkpoint, present, at its size, with its checksum.

Files are read and hashed on several threads (`parallel`), so verification keeps up with
storage; results come back in the order listed. A single file, or files small enough that a
thread hand-off would cost more than reading them, are checked on the calling thread alone (a
single large file in the chunked form still has its chunks hashed in parallel).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import copy_context
from dataclasses import dataclass

from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import parallel
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import InvalidKey, ObjectNotFound, ObjectStore

INLINE_BYTES = cs.READ_CHUNK
"""Listed files that together hold at most this many bytes still to be read (no digest known
for them) are checked on the calling thread."""


@dataclass(frozen=True)
class Listed:
    path: str
    size: int
    checksum: str
    """``algorithm:hex`` (see `checksum`)."""


@dataclass(frozen=True)
class FileCheck:
    path: str
    failure: tuple[Verdict, str] | None = None
    digest: str | None = None
    read: int = 0

    def apply(self, report: Report) -> None:
        report.bytes_read += self.read
        if self.digest is not None:
            report.checksums[self.path] = self.digest
        if self.failure is not None:
            report.fail(*self.failure)


def check_all(
    store: ObjectStore,
    prefix: str,
    files: Sequence[Listed],
    source: str,
    known: Mapping[str, str] | None = None,
) -> list[FileCheck]:
    """Check every listed file; ``source`` names the record in reasons ("manifest").

    ``known`` holds digests already computed over the same files (by the format's own checks):
    one in the listed algorithm is compared instead of reading the file again.
    """
    digests = known or {}

    # Each file's check runs in a copy of the caller's context, so a read observer
    # (`checksum.observe_reads`: progress) sees the pool threads' reads too.
    def job(listed: Listed) -> Callable[[], FileCheck]:
        context = copy_context()
        return lambda: context.run(check, store, prefix, listed, source, digests.get(listed.path))

    jobs = [job(f) for f in files]
    to_read = sum(f.size for f in files if not _same_algorithm(digests.get(f.path), f.checksum))
    if len(jobs) <= 1 or to_read <= INLINE_BYTES:
        return [job() for job in jobs]
    return parallel.run(jobs)


def _same_algorithm(known: str | None, listed: str) -> bool:
    """A digest already computed in the listed algorithm: the file is only stat'ed."""
    return known is not None and known.partition(":")[0] == listed.partition(":")[0]


def check(
    store: ObjectStore, prefix: str, listed: Listed, source: str, known: str | None = None
) -> FileCheck:
    path = inside(listed.path)
    if path is None:
        return FileCheck(
            listed.path,
            (Verdict.UNSAFE, f"{source} names {listed.path!r}, outside the checkpoint"),
        )
    try:
        algorithm, _ = cs.parse(listed.checksum)
    except ValueError as exc:
        return FileCheck(path, (Verdict.CORRUPT, f"{path}: {exc}"))
    key = join(prefix, path)
    read = 0
    try:
        size = store.stat(key).size
        if size != listed.size:
            return FileCheck(
                path, (Verdict.CORRUPT, f"{path}: size {size}, {source} says {listed.size}")
            )
        if known is not None and known.partition(":")[0] == algorithm:
            digest = known
        else:
            digest, read = cs.checksum(store, key, algorithm)
    except ObjectNotFound:
        return FileCheck(path, (Verdict.INCOMPLETE, f"{path}: listed in the {source} but missing"))
    except InvalidKey:
        return FileCheck(
            path, (Verdict.UNSAFE, f"{path}: resolves outside the checkpoint (symlink?)")
        )
    if digest != listed.checksum:
        failure = (Verdict.CORRUPT, f"{path}: checksum {digest}, {source} says {listed.checksum}")
        return FileCheck(path, failure, digest, read)
    return FileCheck(path, None, digest, read)
