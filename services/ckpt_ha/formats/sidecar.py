"""ckpt-ha's two small files beside a checkpoint written by a framework (DCP, a Hugging Face
`Trainer`): who wrote it, and proof that the write finished.

* ``ckpt-ha.identity.json`` (`Intent`) is written **first**, before the framework writes
  anything, and never rewritten: it binds the folder to job, run, attempt, environment and
  topology (R4), and says "a ckpt-ha integration is writing here: wait for its commit file".
  Being the folder's first file, its time fixes the checkpoint id (`formats.identity`).
* ``ckpt-ha.commit.json`` (`Commit`) is written **last**, atomically, by one process (rank 0)
  after every rank's files are durable: each file of the checkpoint with its size and checksum,
  and the step.

Rules every reader applies (the writer-watcher, the integrity-checker, ``ckpt-ha verify``):
an intent without a commit file is a write in progress (never committed, never corrupt, never
quarantined; a stall makes it ``write_failed``); a commit file makes its listed files, at their
listed sizes, the commit evidence, and their checksums the integrity evidence; neither file
leaves the format's own rules (``.metadata`` for DCP, ``trainer_state.json`` for a Trainer).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ckpt_ha.contracts.bounds import Count, WorldSize
from ckpt_ha.contracts.checkpoint import CheckpointIdentity
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import jsondoc, limits, listed
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.formats.report import Report
from ckpt_ha.storage import ObjectNotFound, ObjectStore

INTENT = "ckpt-ha.identity.json"
COMMIT = "ckpt-ha.commit.json"
NAMES = frozenset({INTENT, COMMIT})
MAX_BYTES = limits.MAX_SIDECAR_BYTES


class SidecarInvalid(Exception):
    """A sidecar file exists but is not what ckpt-ha writes (verification judges the folder)."""


class SidecarUnsafe(SidecarInvalid):
    """A commit file names a path outside the checkpoint: hostile, never followed."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Intent(_Frozen):
    schema_version: Literal[1] = 1
    identity: CheckpointIdentity
    format: str = Field(max_length=200)
    """What the framework writes into the folder: ``torch_dcp`` or ``hf_trainer``."""
    step: Count | None = None
    world_size: WorldSize = 1
    """How many processes write into the folder (each rank its own files)."""


class FileEvidence(_Frozen):
    size: Count
    checksum: str = Field(max_length=200)
    """``algorithm:hex`` (see `formats.checksum`)."""


class Commit(_Frozen):
    schema_version: Literal[1] = 1
    step: Count
    files: dict[str, FileEvidence]
    """Every file of the checkpoint except the two sidecars, relative to its folder."""
    exact_resume: bool = True
    """False when the folder holds weights only (no optimizer/scheduler/RNG state)."""
    data_position: Count | None = None

    def paths_inside(self) -> bool:
        return all(inside(path) == path and path not in NAMES for path in self.files)

    def algorithm(self) -> str | None:
        """The one checksum algorithm every file is listed with, None if mixed or unknown."""
        found = {evidence.checksum.partition(":")[0] for evidence in self.files.values()}
        return found.pop() if len(found) == 1 and all(map(cs.known, found)) else None


def encode(doc: Intent | Commit) -> bytes:
    return doc.model_dump_json(indent=2).encode()


def _parse(model: type[Intent] | type[Commit], data: bytes, name: str) -> Intent | Commit:
    if len(data) > MAX_BYTES:
        raise SidecarInvalid(f"{name}: larger than {MAX_BYTES} bytes")
    try:
        return model.model_validate(jsondoc.parse(data))
    except jsondoc.JsonInvalid as exc:
        raise SidecarInvalid(f"{name}: not JSON ({exc})") from None
    except ValidationError as exc:
        raise SidecarInvalid(f"{name}: {exc.error_count()} invalid field(s): {exc}") from None


def parse_intent(data: bytes) -> Intent:
    doc = _parse(Intent, data, INTENT)
    assert isinstance(doc, Intent)
    return doc


def parse_commit(data: bytes) -> Commit:
    doc = _parse(Commit, data, COMMIT)
    assert isinstance(doc, Commit)
    outside = sorted(path for path in doc.files if inside(path) is None)
    if outside:
        raise SidecarUnsafe(f"{COMMIT}: lists {outside[0]!r}, outside the checkpoint")
    if not doc.paths_inside():
        raise SidecarInvalid(f"{COMMIT}: lists a sidecar or a path not in normal form")
    return doc


def read_intent(store: ObjectStore, prefix: str) -> Intent | None:
    """The folder's intent, None when it has none; `SidecarInvalid` when it is not readable."""
    data = _read(store, join(prefix, INTENT), INTENT)
    return None if data is None else parse_intent(data)


def read_commit(store: ObjectStore, prefix: str) -> Commit | None:
    """The folder's commit file, None when it has none; `SidecarInvalid` when not readable."""
    data = _read(store, join(prefix, COMMIT), COMMIT)
    return None if data is None else parse_commit(data)


def _read(store: ObjectStore, key: str, name: str) -> bytes | None:
    """The sidecar's bytes, None when absent; never more than `MAX_BYTES` read."""
    try:
        size = store.stat(key).size
        if size > MAX_BYTES:
            raise SidecarInvalid(f"{name}: {size} bytes, larger than {MAX_BYTES}")
        return store.read_bytes(key)
    except ObjectNotFound:
        return None


def write_intent(store: ObjectStore, prefix: str, intent: Intent) -> None:
    """Before the framework writes anything (never overwrites: the folder must be new)."""
    store.put_if_absent(join(prefix, INTENT), encode(intent))


def write_commit(store: ObjectStore, prefix: str, commit: Commit) -> None:
    """Last, once every file listed is durable (`put_if_absent` is atomic on every store)."""
    store.put_if_absent(join(prefix, COMMIT), encode(commit))


def check(
    store: ObjectStore, prefix: str, commit: Commit, present: set[str], report: Report
) -> None:
    """The commit's integrity evidence, on top of the format's own checks already in ``report``:
    every listed file present at its size and checksum; files present but not listed are noted.

    A digest the format's checks computed in the listed algorithm is compared, not recomputed,
    so each file is read once; the report keeps the digests in the commit's algorithms.
    """
    files = [listed.Listed(path, e.size, e.checksum) for path, e in sorted(commit.files.items())]
    known = {path: report.checksums.pop(path) for path in commit.files if path in report.checksums}
    for result in listed.check_all(store, prefix, files, "commit file", known):
        result.apply(report)
    unlisted = sorted(present - set(commit.files) - NAMES)
    if unlisted:
        report.notes.append(
            f"{len(unlisted)} file(s) not in {COMMIT}, not part of the checkpoint: "
            + ", ".join(unlisted[:10])
        )
    report.step = commit.step
    report.exact_resume = commit.exact_resume and report.exact_resume is not False
    if report.ok:
        report.checks += ["commit-sidecar", "commit-sizes", "commit-checksums"]
