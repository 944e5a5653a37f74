"""PyTorch Distributed Checkpoint (DCP) folders: ``.metadata`` plus ``*.distcp`` data files.

The writer (``FileSystemWriter``) writes every rank's ``__<rank>_<n>.distcp`` first and the
pickled ``.metadata`` last (via a rename), so ``.metadata`` is the commit marker. It maps each
state-dict item (tensor chunk or pickled "bytes" object) to (relative path, offset, length) in a
data file; it records no file size and no checksum.

Checks, all without torch and without running the pickle (see `dcp_metadata`):

* ``.metadata`` unpickles with the restricted unpickler (a global outside DCP's own → unsafe);
* every storage entry's path stays inside the checkpoint, its file exists and is at least
  offset+length long, and every declared tensor chunk / bytes item has a storage entry;
* every data file is checksummed (the reference for later checks; DCP keeps none).

Tensors are stored as ``torch.save`` archives inside the data files, so an entry's length is not
dtype x shape and is checked against the file size only. DCP's own loader unpickles "bytes"
items without restriction, so every one has its pickle read by the restricted unpickler
(`torch_pickle`: only the item's ``data.pkl``, at any size), and one with a hostile pickle makes
the checkpoint unsafe; when torch is installed, items up to `limits.MAX_LOAD_BYTES` are also
loaded with ``torch.load(weights_only=True)``.

Step: DCP has no step field. The step is a top-level ``step`` bytes item holding a plain int
(read from its ``torch.save`` archive with a restricted unpickler that allows no globals at
all), else the folder name's trailing digits (``step-<n>``, ``checkpoint-<n>``, ``…<n>``), else
None; report.checks says which source was used.
"""

from __future__ import annotations

import io
import re
import zipfile

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import dcp_metadata, jsondoc, torch_load, torch_pickle
from ckpt_ha.formats.dcp_metadata import DcpMetadata, MalformedMetadata, UnsafeMetadata
from ckpt_ha.formats.paths import folder_name, inside, join
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import InvalidKey, ObjectNotFound, ObjectStore

METADATA = ".metadata"
DATA_SUFFIX = ".distcp"
MAX_STEP_ITEM_BYTES = 1024 * 1024
_TRAILING_DIGITS = re.compile(r"(?<!\d)(\d{1,15})$")
"""At most 15 digits: a step an event can carry (below 2**53), never a 5,000-digit name."""


def read_metadata(store: ObjectStore, prefix: str, report: Report) -> DcpMetadata | None:
    """The parsed ``.metadata``, or None with the failure recorded in ``report``."""
    key = join(prefix, METADATA)
    try:
        size = store.stat(key).size
        if size > dcp_metadata.MAX_METADATA_BYTES:
            report.fail(
                Verdict.CORRUPT,
                f"{METADATA} is {size} bytes (limit {dcp_metadata.MAX_METADATA_BYTES})",
            )
            return None
        data = store.read_bytes(key)
    except ObjectNotFound:
        report.fail(Verdict.INCOMPLETE, f"{METADATA} is missing: the write never committed")
        return None
    except InvalidKey:
        report.fail(Verdict.UNSAFE, f"{METADATA} resolves outside the checkpoint (symlink?)")
        return None
    try:
        return dcp_metadata.parse(data)
    except UnsafeMetadata as exc:
        report.fail(Verdict.UNSAFE, f"{METADATA}: {exc}; refusing to unpickle it")
    except MalformedMetadata as exc:
        report.fail(Verdict.CORRUPT, f"{METADATA}: not DCP metadata: {exc}")
    return None


def verify(
    store: ObjectStore, prefix: str, names: set[str], algorithm: str = cs.DEFAULT_ALGORITHM
) -> Report:
    report = Report(format=CheckpointFormat.TORCH_DCP)
    listed = sorted({n for n in names if n.endswith(DATA_SUFFIX)} | {METADATA})
    # `.metadata` is parsed before the data is hashed, not beside it: the parse is Python and
    # holds the GIL, and a hashing thread takes the GIL back between every two pieces (the
    # lease poll, the residency check), each time waiting up to the switch interval (5 ms)
    # for the parse to let go of it — which slowed the hashing far more than the parse costs.
    metadata = read_metadata(store, prefix, report)
    if metadata is None:
        return report
    checks = ["dcp-metadata:restricted-unpickle"]

    needed: dict[str, int] = {}
    for entry in metadata.storage:
        path = inside(entry.relative_path)
        if path is None:
            report.fail(
                Verdict.UNSAFE,
                f"{METADATA}: {entry.fqn!r} is stored at {entry.relative_path!r}, outside",
            )
            continue
        needed[path] = max(needed.get(path, 0), entry.offset + entry.length)
    if not report.ok:
        return report
    for path, least in sorted(needed.items()):
        try:
            size = store.stat(join(prefix, path)).size
        except ObjectNotFound:
            report.fail(Verdict.INCOMPLETE, f"{path}: named in {METADATA} but missing")
            continue
        except InvalidKey:
            report.fail(Verdict.UNSAFE, f"{path}: resolves outside the checkpoint (symlink?)")
            continue
        if size < least:
            report.fail(Verdict.CORRUPT, f"{path}: {size} bytes, {METADATA} needs at least {least}")
    _check_coverage(metadata, report)
    if report.ok:
        checks += ["storage-entries-inside", "data-file-sizes", "items-stored"]

    later = sorted(set(needed) - set(listed))  # named by .metadata but not listed: missing
    digests = _checksums(store, prefix, listed + later, algorithm)
    for path, digest, read in digests:
        report.bytes_read += read
        if digest is not None:
            report.checksums[path] = digest
    if report.ok:
        checks.append("checksums-recorded")
        checks.append(_check_bytes_items(store, prefix, metadata, report))
    report.step, source = recorded_step(store, prefix, metadata)
    checks.append(f"step:{source}")
    if report.ok:
        report.checks += checks
    return report


def _check_coverage(metadata: DcpMetadata, report: Report) -> None:
    stored = {(e.fqn, e.chunk_offset) for e in metadata.storage}
    for item in metadata.items.values():
        wanted = [None] if item.kind == "bytes" else [offsets for offsets, _ in item.chunks]
        for offsets in wanted:
            if (item.fqn, offsets) not in stored:
                where = "" if offsets is None else f" chunk at {list(offsets)}"
                report.fail(
                    Verdict.CORRUPT, f"{METADATA}: {item.fqn!r}{where} has no storage entry"
                )
                return


def _checksums(
    store: ObjectStore, prefix: str, files: list[str], algorithm: str
) -> list[tuple[str, str | None, int]]:
    """(path, digest or None when missing, bytes read) of each of ``files``, checksummed on the
    calling thread and the verification pool together, every chunk of every file one job
    (`checksum.checksum_many`). Every data file in the folder is read whatever ``.metadata``
    says."""
    found = cs.checksum_many(store, [join(prefix, path) for path in files], algorithm)
    digests: list[tuple[str, str | None, int]] = []
    for path, result in zip(files, found, strict=True):
        if isinstance(result, (ObjectNotFound, InvalidKey)):
            digests.append((path, None, 0))  # reported by the size checks
        elif isinstance(result, BaseException):
            raise result
        else:
            digests.append((path, *result))
    return digests


def _check_bytes_items(
    store: ObjectStore, prefix: str, metadata: DcpMetadata, report: Report
) -> str:
    """DCP's loader unpickles "bytes" items unrestricted: each item's pickle is read by the
    restricted unpickler, always; then loaded with weights_only=True where torch can."""
    kinds = {fqn: item.kind for fqn, item in metadata.items.items()}
    items = [e for e in metadata.storage if kinds.get(e.fqn) == "bytes"]
    for entry in items:
        path = inside(entry.relative_path) or ""
        failure = torch_pickle.check(
            store,
            join(prefix, path),
            f"{path}: item {entry.fqn!r}",
            offset=entry.offset,
            length=entry.length,
        )
        if failure is not None:
            report.fail(*failure)
    if not report.ok:
        return "dcp-bytes:restricted-unpickle"
    if torch_load.torch_module() is None:
        return "dcp-bytes:not-loaded (torch not installed)"
    skipped = 0
    for entry in items:
        if entry.length > torch_load.MAX_LOAD_BYTES:
            skipped += 1
            continue
        path = inside(entry.relative_path) or ""
        data = store.read_bytes(join(prefix, path), offset=entry.offset, length=entry.length)
        failure = torch_load.check(data, f"{path}: item {entry.fqn!r}")
        if failure is not None:
            report.fail(*failure)
    if skipped:
        return f"dcp-bytes:weights_only ({skipped} over the size limit not loaded)"
    return "dcp-bytes:weights_only"


def recorded_step(
    store: ObjectStore, prefix: str, metadata: DcpMetadata | None
) -> tuple[int | None, str]:
    """(step, where it came from): the ``step`` item, else the folder name's trailing digits."""
    entry = next((e for e in (metadata.storage if metadata else ()) if e.fqn == "step"), None)
    item = metadata.items.get("step") if metadata else None
    if entry is not None and item is not None and item.kind == "bytes":
        path = inside(entry.relative_path)
        if path is not None and entry.length <= MAX_STEP_ITEM_BYTES:
            key = join(prefix, path)
            try:
                data = store.read_bytes(key, offset=entry.offset, length=entry.length)
            except (ObjectNotFound, InvalidKey):
                data = b""
            value = _saved_int(data)
            if value is not None:
                return value, "state-dict-item"
    match = _TRAILING_DIGITS.search(folder_name(store, prefix))
    if match:
        return int(match.group(1)), "folder-name"
    return None, "none"


def _saved_int(data: bytes) -> int | None:
    """The int in a ``torch.save`` archive, read with a no-globals unpickler (None otherwise)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            member = next((i for i in archive.infolist() if i.filename.endswith("/data.pkl")), None)
            if member is None or member.file_size > MAX_STEP_ITEM_BYTES:
                return None
            value = dcp_metadata.restricted_loads(archive.read(member), {})
    except (zipfile.BadZipFile, UnsafeMetadata, MalformedMetadata, OSError, EOFError):
        return None
    return jsondoc.count(value)
