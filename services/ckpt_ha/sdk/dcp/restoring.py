"""`resume`: every rank checks what DCP will read before ``dcp.load`` runs, and the group
reports one outcome (see the package doc)."""

from __future__ import annotations

import io
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.futures import Future

from ckpt_ha.contracts.checkpoint import CheckpointFormat, FailureSide
from ckpt_ha.contracts.resume import LoadBlame, ResumePlannedV2
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import dcp_metadata, detect, parallel, sidecar, torch_load
from ckpt_ha.formats.dcp import METADATA, recorded_step
from ckpt_ha.formats.dcp_metadata import DcpMetadata, MalformedMetadata, UnsafeMetadata
from ckpt_ha.formats.paths import inside, join
from ckpt_ha.formats.sidecar import Commit, FileEvidence, SidecarInvalid, SidecarUnsafe
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.checkpoints import CheckpointUnreadable
from ckpt_ha.sdk.dcp.files import NeedsFilesystemRoot, written_by
from ckpt_ha.sdk.dcp.group import Group
from ckpt_ha.sdk.dcp.reading import FileHash, read_in_place
from ckpt_ha.sdk.protocol import Context, context
from ckpt_ha.sdk.resuming import (
    LOADERS,
    Describe,
    PlannedFolder,
    ResumeFailed,
    UnsupportedFormat,
    check_planned,
    classify_failure,
    locate,
    report_load_failed,
    report_loaded,
    waiting_for_storage,
)
from ckpt_ha.storage import FsStore, ObjectNotFound

log = logging.getLogger("ckpt_ha.sdk")
LOADER = "ckpt_ha.sdk.dcp.resume()"


@dataclass(frozen=True)
class DcpResumed:
    """A plan carried out: ``state_dict`` was loaded in place by ``dcp.load``."""

    plan: ResumePlannedV2
    step: int
    uri: str
    state_dict: dict[str, Any]
    checksums_verified: bool
    """False for a folder without a commit sidecar (a plain ``dcp.save``): DCP records no
    checksums, so only the sizes ``.metadata`` implies were checked."""


@dataclass(frozen=True)
class _Checked:
    """What this rank checked: the ``.metadata`` bytes DCP will unpickle, and the step."""

    path: Path
    uri: str
    metadata: bytes
    step: int
    checksums_verified: bool
    where: PlannedFolder
    to_hash: dict[str, FileEvidence]
    """This rank's share of the data files whose checksums are still to be read, while
    ``dcp.load`` runs."""
    written_world_size: int | None = None
    """How many ranks wrote it (the intent sidecar), when known."""

    def start_hashing(self, plan: ResumePlannedV2, names: set[str]) -> Callable[[], object]:
        """Start reading ``names`` of this rank's share for their checksums on the verification
        pool, now; the returned join takes what no pool thread has taken and raises the first
        failure."""
        where = self.where

        def job(name: str, evidence: FileEvidence) -> Callable[[], None]:
            return lambda: waiting_for_storage(plan, lambda: _check_checksum(where, name, evidence))

        return parallel.start([job(n, self.to_hash[n]) for n in sorted(names)])


class _DcpGlobalsOnly(pickle.Unpickler):
    """Resolves only the globals `dcp_metadata` allows (to the real torch objects)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in dcp_metadata.ALLOWED:
            raise UnsafeMetadata(f"global {module}.{name}")
        return super().find_class(module, name)


class _CheckedReader(FileSystemReader):
    """DCP's filesystem reader, given the ``.metadata`` bytes that passed the checks: DCP builds
    its plan from those, never from a file swapped in after the check. With ``checked``, it
    verifies this rank's share of the files while it loads (`verified`)."""

    def __init__(
        self, path: Path, metadata: bytes, checked: _Checked | None = None, plan: Any = None
    ) -> None:
        super().__init__(path)
        self._checked = metadata
        self._share = checked
        self._plan = plan
        self._hashed: Callable[[], object] | None = None
        self._fused: dict[str, FileHash] = {}

    def verified(self) -> None:
        """Once the load is over: check this rank's share (the files hashed during the read,
        and the others, hashed beside it, or now if the load never read); raises the first
        failure."""
        checked = self._share
        if checked is None:
            return
        hashed = self._hashed or checked.start_hashing(self._plan, set(checked.to_hash))
        failure: Exception | None = None
        try:
            hashed()
        except Exception as exc:  # noqa: BLE001 -- the fused files still get checked
            failure = exc
        for name, hashing in sorted(self._fused.items()):
            if hashing.broken or hashing.result is None:  # the read stopped short: read it now
                _check_checksum(checked.where, name, checked.to_hash[name])
            else:
                _match(checked.where, name, checked.to_hash[name], *hashing.result)
        if failure is not None:
            raise failure

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = cast(Metadata, _DcpGlobalsOnly(io.BytesIO(self._checked)).load())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Each tensor that matches its target exactly is read straight into it, file by file
        in file order (`reading`); DCP's own read does the rest."""
        rest: list[ReadItem] = []
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            if req.type == LoadItemType.TENSOR and not info.transform_descriptors:
                per_file.setdefault(info.relative_path, []).append(req)
            else:
                rest.append(req)
        share = self._share.to_hash if self._share is not None else {}
        if self._share is not None:  # the files it does not read are hashed beside the load
            self._hashed = self._share.start_hashing(self._plan, set(share) - set(per_file))
        for relative, reqs in per_file.items():
            evidence = share.get(relative)
            hashing = FileHash(cs.parse(evidence.checksum)[0]) if evidence else None
            if hashing is not None:
                self._fused[relative] = hashing
            with self.fs.create_stream(self.fs.concat_path(self.path, relative), "rb") as stream:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    info = self.storage_data[req.storage_index]
                    if not read_in_place(stream, info.offset, info.length, req, planner, hashing):
                        rest.append(req)
                if hashing is not None:
                    hashing.finish(stream.fileno())
        return super().read_data(LoadPlan(rest, plan.storage_data, plan.planner_data), planner)


def _read_metadata(where: PlannedFolder, commit: Commit | None) -> tuple[bytes, DcpMetadata]:
    """``.metadata``'s bytes, unpickled only by the restricted unpickler, then matched against
    the commit sidecar."""
    key = join(where.prefix, METADATA)
    try:
        size = where.store.stat(key).size
    except ObjectNotFound as exc:
        reason = f"{METADATA} is missing: the write never committed"
        raise CheckpointUnreadable(where.uri, "incomplete", reason) from exc
    if size > dcp_metadata.MAX_METADATA_BYTES:
        limit = dcp_metadata.MAX_METADATA_BYTES
        raise CheckpointUnreadable(where.uri, "corrupt", f"{METADATA} is {size} bytes ({limit=})")
    data = where.store.read_bytes(key)
    try:
        parsed = dcp_metadata.parse(data)
    except UnsafeMetadata as exc:
        reason = f"{METADATA}: {exc}; refusing to unpickle it"
        raise CheckpointUnreadable(where.uri, "unsafe", reason) from exc
    except MalformedMetadata as exc:
        reason = f"{METADATA}: not DCP metadata: {exc}"
        raise CheckpointUnreadable(where.uri, "corrupt", reason) from exc
    if commit is not None:
        evidence = commit.files.get(METADATA)
        if evidence is None:
            raise CheckpointUnreadable(where.uri, "corrupt", f"the commit does not list {METADATA}")
        _compare(where, METADATA, len(data), evidence)
        if cs.of_bytes(data, _algorithm(where, METADATA, evidence)) != evidence.checksum:
            raise CheckpointUnreadable(where.uri, "corrupt", f"{METADATA}: checksum mismatch")
    return data, parsed


def _algorithm(where: PlannedFolder, name: str, evidence: FileEvidence) -> str:
    try:
        return cs.parse(evidence.checksum)[0]
    except ValueError as exc:
        raise CheckpointUnreadable(where.uri, "corrupt", f"{name}: {exc}") from exc


def _compare(where: PlannedFolder, name: str, size: int, evidence: FileEvidence) -> None:
    if size != evidence.size:
        reason = f"{name}: {size} bytes, the commit says {evidence.size}"
        raise CheckpointUnreadable(where.uri, "corrupt", reason)


def share(files: list[str], rank: int, size: int) -> list[str]:
    """The data files ``rank`` verifies: those rank ``r`` wrote (``__<r>_<n>.distcp``) go to rank
    ``r % size``, others round-robin. Each file is verified by exactly one rank."""
    mine = []
    for index, name in enumerate(sorted(files)):
        writer = written_by(name)
        owner = writer if writer is not None else index
        if owner % size == rank:
            mine.append(name)
    return mine


def _check_size(where: PlannedFolder, name: str, least: int, evidence: FileEvidence | None) -> None:
    """A file's size against the commit and what ``.metadata`` needs: a truncated file fails
    here, before anything reads it."""
    key = join(where.prefix, name)
    try:
        size = where.store.stat(key).size
    except ObjectNotFound as exc:
        raise CheckpointUnreadable(where.uri, "corrupt", f"{name} is missing") from exc
    if evidence is not None:
        _compare(where, name, size, evidence)
    if size < least:
        reason = f"{name}: {size} bytes, {METADATA} needs at least {least}"
        raise CheckpointUnreadable(where.uri, "corrupt", reason)


def _check_checksum(where: PlannedFolder, name: str, evidence: FileEvidence) -> None:
    """A file's checksum against the commit (the read `resume` overlaps with ``dcp.load``)."""
    key = join(where.prefix, name)
    try:
        digest, read = cs.checksum(where.store, key, _algorithm(where, name, evidence))
    except ObjectNotFound as exc:
        raise CheckpointUnreadable(where.uri, "corrupt", f"{name} is missing") from exc
    _match(where, name, evidence, digest, read)


def _match(where: PlannedFolder, name: str, evidence: FileEvidence, digest: str, read: int) -> None:
    _compare(where, name, read, evidence)
    if digest != evidence.checksum:
        raise CheckpointUnreadable(where.uri, "corrupt", f"{name}: checksum mismatch")


def _check_bytes_items(where: PlannedFolder, metadata: DcpMetadata, files: set[str]) -> None:
    """DCP's loader unpickles "bytes" items unrestricted: each must load with weights_only."""
    for entry in metadata.storage:
        item = metadata.items.get(entry.fqn)
        path = inside(entry.relative_path)
        if item is None or item.kind != "bytes" or path not in files:
            continue
        key = join(where.prefix, path)  # loaded whatever its size: DCP is about to load it too
        data = where.store.read_bytes(key, offset=entry.offset, length=entry.length)
        failure = torch_load.check(data, f"{path}: item {entry.fqn!r}")
        if failure is not None:
            raise CheckpointUnreadable(where.uri, failure[0].value, failure[1])


def _check_share(plan: ResumePlannedV2, ctx: Context, group: Group) -> _Checked:
    """This rank's checks before DCP reads anything: format, folder, ``.metadata`` (every rank),
    and its `share` of the data files (sizes, checksums, "bytes" items)."""
    fmt = plan.checkpoint_format
    if fmt is not None and fmt != CheckpointFormat.TORCH_DCP.value:
        raise UnsupportedFormat(fmt, LOADER, LOADERS.get(fmt, "its framework"))
    where = locate(plan, ctx)
    if not isinstance(where.store, FsStore):
        raise NeedsFilesystemRoot(where.uri)
    if fmt is None:  # a plan from before formats were recorded: tell it from the folder
        base = f"{where.prefix}/" if where.prefix else ""
        names = {info.key[len(base) :].split("/", 1)[0] for info in where.store.list(base)}
        found = detect(names)
        if names and found is not CheckpointFormat.TORCH_DCP:
            raise UnsupportedFormat(found.value, LOADER, LOADERS.get(found.value, "its framework"))
    try:
        commit = sidecar.read_commit(where.store, where.prefix)
    except SidecarUnsafe as exc:
        raise CheckpointUnreadable(where.uri, "unsafe", str(exc)) from exc
    except SidecarInvalid as exc:
        raise CheckpointUnreadable(where.uri, "corrupt", str(exc)) from exc
    data, metadata = _read_metadata(where, commit)
    outside = sorted({e.relative_path for e in metadata.storage if inside(e.relative_path) is None})
    if outside:
        reason = f"{METADATA} stores items outside the checkpoint: {outside}"
        raise CheckpointUnreadable(where.uri, "unsafe", reason)
    needed = metadata.needed_sizes(inside)
    if commit is not None and (unlisted := sorted(set(needed) - set(commit.files))):
        reason = f"{METADATA} names files the commit does not list: {unlisted}"
        raise CheckpointUnreadable(where.uri, "corrupt", reason)
    if commit is not None:
        step: int | None = commit.step
    else:
        step, _ = recorded_step(where.store, where.prefix, metadata)
    check_planned(where, plan, step)
    files = set(needed) | ({n for n in commit.files if n != METADATA} if commit else set())
    mine = share(sorted(files), group.rank, group.size)
    to_hash: dict[str, FileEvidence] = {}
    for name in mine:
        evidence = commit.files.get(name) if commit is not None else None
        _check_size(where, name, needed.get(name, 0), evidence)
        if evidence is not None:
            _algorithm(where, name, evidence)  # an unknown algorithm fails before the load
            to_hash[name] = evidence
    _check_bytes_items(where, metadata, set(mine))
    if commit is None and group.rank == 0:
        log.warning(
            "%s has no %s (a plain dcp.save): DCP records no checksums, so only the file sizes "
            "%s implies were checked",
            where.uri,
            sidecar.COMMIT,
            METADATA,
        )
    path = where.store.root / where.prefix if where.prefix else where.store.root
    written = _written_world_size(where)
    step = plan.step if step is None else step
    return _Checked(path, where.uri, data, step, commit is not None, where, to_hash, written)


def _written_world_size(where: PlannedFolder) -> int | None:
    """The world size the intent sidecar records (None: a plain ``dcp.save``, or unreadable:
    the checks above decided on the files already)."""
    try:
        intent = sidecar.read_intent(where.store, where.prefix)
    except (SidecarInvalid, SidecarUnsafe):
        return None
    return intent.world_size if intent is not None else None


def _agree(group: Group, ctx: Context, plan: ResumePlannedV2, exc: Exception | None) -> None:
    """A failure on any rank is the group's: rank 0 reports the first failing rank's, with what
    it blames (`classify_failure`), and every rank raises `ResumeFailed`."""
    mine = None
    if exc is not None:
        blame, side = classify_failure(exc)
        mine = (str(exc) or type(exc).__name__, blame.value, side.value)
    outcomes = group.all_gather(mine)
    first = next(((rank, o) for rank, o in enumerate(outcomes) if o is not None), None)
    if first is None:
        return
    rank, (reason, blame_value, side_value) = first
    if group.rank == 0:
        blame, side = LoadBlame(blame_value), FailureSide(side_value)
        report_load_failed(
            ctx, plan, reason, blame, side, rank=rank if group.pg is not None else None
        )
    where = f"rank {rank}: " if group.pg is not None else ""
    raise ResumeFailed(plan, f"{where}{reason}") from exc


@marks.during("load")
def resume(
    state_dict: dict[str, Any],
    *,
    ctx: Context | None = None,
    describe: Describe | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> DcpResumed | None:
    """Carry out this attempt's resume plan on every rank: None on a fresh start (no plan).

    With a plan (format ``torch_dcp``), before DCP reads anything:

    * every rank checks ``.metadata`` with the restricted unpickler (a pickle asking for code
      is refused, never run) and against the commit sidecar, and the plan's checkpoint id and
      step against the folder;
    * the data files are checked once across the group, each by one rank (`share`): its size
      against the commit sidecar (without one, a plain ``dcp.save``, only the sizes
      ``.metadata`` implies, and a warning says so), and every pickled "bytes" item in it with
      ``torch.load(weights_only=True)``. No rank loads until every rank's share passed.

    Then ``dcp.load`` loads ``state_dict`` in place (from the checked ``.metadata`` bytes):
    a stored tensor that matches its target exactly is read straight into it (`reading`), and
    a file of the rank's share that it loads is checksummed during that same read, the bytes
    hashed as they land; the rest of its share is hashed on the verification pool beside the
    load (so a restore costs one read of the files, not a load and a second pass). All files are
    verified, not only those a rank reads, and no rank returns until every rank's share passed:
    every shard any rank loaded has been verified before training goes on. A damaged file
    fails the resume on every rank, and ``state_dict`` then holds what was loaded (as after any
    failed ``dcp.load``). A failure on any rank is a failure of all: rank 0 publishes
    ``resume.load_failed`` (blaming the checkpoint only when its bytes failed the checks, with
    the first failing rank) and every rank raises `ResumeFailed`; on success rank 0 publishes
    ``resume.loaded`` (with what ``describe`` gives for its state). A plan of another format
    raises `ResumeFailed` blaming this attempt (`UnsupportedFormat`).
    """
    ctx = ctx if ctx is not None else context()
    if ctx is None or ctx.plan is None:
        return None
    plan = ctx.plan
    group = Group.of(process_group)
    started = time.monotonic()
    checked: _Checked | None = None
    failure: Exception | None = None
    try:
        checked = waiting_for_storage(plan, lambda: _check_share(plan, ctx, group))
    except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
        failure = exc
    _agree(group, ctx, plan, failure)
    assert checked is not None
    described: tuple[int | None, str | None] = (None, None)
    reader = _CheckedReader(checked.path, checked.metadata, checked, plan)
    try:
        dcp_load(
            state_dict, storage_reader=reader, process_group=group.pg, no_dist=group.pg is None
        )
    except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it, or they wait forever
        failure = exc
    try:
        reader.verified()
    except Exception as exc:  # noqa: BLE001 -- a damaged file explains a failed load: it wins
        failure = exc
    if failure is None and describe is not None and group.rank == 0:
        try:
            described = describe(state_dict)
        except Exception as exc:  # noqa: BLE001 -- the other ranks must learn it
            failure = exc
    _agree(group, ctx, plan, failure)
    if group.rank == 0:
        report_loaded(
            ctx,
            plan,
            step=checked.step,
            seconds=time.monotonic() - started,
            data_position=described[0],
            rng_fingerprint=described[1],
            world_size=group.size,
            written_world_size=checked.written_world_size,
        )
        if checked.written_world_size not in (None, group.size):
            log.info(
                "%s was written by %d ranks and loaded by %d: DCP resharded it",
                checked.uri, checked.written_world_size, group.size,
            )  # fmt: skip
    return DcpResumed(plan, checked.step, checked.uri, state_dict, checked.checksums_verified)
