"""Checkpoint formats: recognise a layout on storage and verify it. One layer, used by the
services and by `ckpt-ha verify`.

Recognised and verified: the native ckpt-ha manifest, safetensors (single and sharded),
Hugging Face Trainer folders and PyTorch Distributed Checkpoint (DCP) folders, and the identity
and commit sidecars ckpt-ha's framework integrations write beside the last two (`sidecar`).
Pickled content is never unpickled unrestricted: DCP metadata and the pickle of every torch
file go through a restricted, bounded unpickler (`restricted_pickle`, `dcp_metadata`,
`torch_pickle`), and torch files are additionally loaded only with ``weights_only=True`` when
torch is installed (`torch_load`). Every parsing limit is in `limits`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import dcp, hf_trainer, native, safetensors, sidecar
from ckpt_ha.formats.checksum import DEFAULT_ALGORITHM
from ckpt_ha.formats.paths import confine, folder_name, one_reading
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import FsStore, InvalidKey, ObjectStore, StorageError

__all__ = ["Report", "Verdict", "detect", "latest_valid", "verify", "verify_file", "verify_path"]


def _listing(store: ObjectStore, prefix: str) -> set[str]:
    """Every file under the folder, relative to it."""
    base = f"{prefix.rstrip('/')}/" if prefix else ""
    return {info.key[len(base) :] for info in store.list(base)}


def _top_level(files: set[str]) -> set[str]:
    return {name.split("/", 1)[0] for name in files}


def detect(names: set[str], folder: str = "") -> CheckpointFormat:
    """The layout of a folder named ``folder`` whose top-level entries are ``names``.

    ckpt-ha's sidecars say nothing about the layout: it is the framework's beside them. A
    folder that looks like a Hugging Face Trainer's (named ``checkpoint-<n>``, or holding a
    file only the Trainer writes) is one, whatever weights it holds: it is never judged as bare
    safetensors, whose commit rule (the file's own size) says nothing about the Trainer's save.
    """
    names = names - sidecar.NAMES
    if native.MANIFEST in names:
        return CheckpointFormat.NATIVE
    if dcp.METADATA in names or any(n.endswith(dcp.DATA_SUFFIX) for n in names):
        return CheckpointFormat.TORCH_DCP
    if hf_trainer.is_trainer_folder(folder, names):
        return CheckpointFormat.HF_TRAINER
    if any(n.endswith((".safetensors", safetensors.INDEX_SUFFIX)) for n in names):
        return CheckpointFormat.SAFETENSORS
    return CheckpointFormat.UNKNOWN


def verify(
    store: ObjectStore,
    prefix: str,
    algorithm: str = DEFAULT_ALGORITHM,
    *,
    ranks: bool = True,
    trial_load: bool = True,
) -> Report:
    """Verify the checkpoint folder at ``prefix``.

    ``ranks=False`` (the scrub) skips the check that a native manifest holds every declared
    rank (`native.missing_ranks`), decided once at verification. ``trial_load=False`` (a resume
    whose framework loads the files with ``torch.load(weights_only=True)`` right after) skips
    the trial load of a Trainer folder's torch files: their restricted unpickling and
    checksums still run, and the framework's own load is the trial.

    A folder with ckpt-ha's sidecars is judged by them first (`formats.sidecar`), and by its
    format's own checks as well. Permanent storage errors become a verdict; a transient one
    (`StorageUnavailable`) is raised, because an outage says nothing about the checkpoint.
    Nothing is read outside the folder (`paths.confine`): a file linked out of it is unsafe.
    """
    try:
        store, prefix = confine(store, prefix)
    except InvalidKey as exc:
        report = Report(format=CheckpointFormat.UNKNOWN)
        report.fail(Verdict.UNSAFE, f"{exc.reason}: refusing to read it")
        return report
    with one_reading(store):
        return _verify_confined(store, prefix, algorithm, ranks=ranks, trial_load=trial_load)


def _verify_confined(
    store: ObjectStore, prefix: str, algorithm: str, *, ranks: bool, trial_load: bool
) -> Report:
    files = _listing(store, prefix)
    names = _top_level(files)
    fmt = detect(names, folder_name(store, prefix))
    try:
        if names & sidecar.NAMES:
            return _verify_sidecars(store, prefix, files, fmt, algorithm, trial_load=trial_load)
        return _verify_format(
            store, prefix, names, fmt, algorithm, ranks=ranks, trial_load=trial_load
        )
    except StorageError as exc:
        if exc.transient:
            raise  # an outage is not a verdict on the checkpoint: the caller retries
        report = Report(format=fmt)
        report.fail(Verdict.INCOMPLETE, f"storage error while verifying: {exc}")
        return report


def _verify_format(
    store: ObjectStore,
    prefix: str,
    names: set[str],
    fmt: CheckpointFormat,
    algorithm: str,
    *,
    ranks: bool = True,
    trial_load: bool = True,
) -> Report:
    if fmt is CheckpointFormat.NATIVE:
        return native.verify(store, prefix, ranks=ranks)
    if fmt is CheckpointFormat.SAFETENSORS:
        return safetensors.verify_folder(store, prefix, names, algorithm)
    if fmt is CheckpointFormat.HF_TRAINER:
        return hf_trainer.verify(store, prefix, names, algorithm, trial_load=trial_load)
    if fmt is CheckpointFormat.TORCH_DCP:
        return dcp.verify(store, prefix, names, algorithm)
    report = Report(format=fmt)
    report.fail(Verdict.UNKNOWN, "no recognised checkpoint layout")
    return report


def _verify_sidecars(
    store: ObjectStore,
    prefix: str,
    files: set[str],
    fmt: CheckpointFormat,
    algorithm: str,
    *,
    trial_load: bool = True,
) -> Report:
    """An intent without a commit file is a write that never committed; a commit file adds its
    sizes, checksums, step and exact-resume flag to the format's own checks."""
    names = _top_level(files) - sidecar.NAMES
    notes: list[str] = []
    try:
        intent = sidecar.read_intent(store, prefix)
    except sidecar.SidecarInvalid as exc:
        intent = None
        notes.append(f"{exc}: the checkpoint's identity is unknown")
    if intent is not None and intent.format in set(CheckpointFormat):
        fmt = CheckpointFormat(intent.format)
    report = Report(format=fmt, notes=notes)
    if sidecar.COMMIT not in files:
        report.fail(
            Verdict.INCOMPLETE,
            f"{sidecar.INTENT} without {sidecar.COMMIT}: a ckpt-ha integration started writing "
            "and never committed",
        )
        return report
    try:
        commit = sidecar.read_commit(store, prefix)
    except sidecar.SidecarInvalid as exc:
        verdict = Verdict.UNSAFE if isinstance(exc, sidecar.SidecarUnsafe) else Verdict.CORRUPT
        report.fail(verdict, str(exc))
        return report
    if commit is None:
        report.fail(Verdict.INCOMPLETE, f"{sidecar.COMMIT} vanished while it was read")
        return report
    report = _verify_format(
        store, prefix, names, fmt, commit.algorithm() or algorithm, trial_load=trial_load
    )
    report.notes += notes
    sidecar.check(store, prefix, commit, files, report)
    return report


def verify_path(path: Path, algorithm: str = DEFAULT_ALGORITHM) -> Report:
    """Offline verdict for a local folder or single file (what `ckpt-ha verify` prints)."""
    if path.is_dir():
        return verify(FsStore(path), "", algorithm)
    return verify_file(FsStore(path.parent), path.name, algorithm)


def verify_file(store: ObjectStore, name: str, algorithm: str = DEFAULT_ALGORITHM) -> Report:
    """Offline verdict for one checkpoint file `name` on its own (a safetensors file or a
    Trainer's weights file), on any store."""
    if name.endswith(".safetensors"):
        report, _ = safetensors.verify_file(store, name, name, None, algorithm)
        if report.ok:
            report.checks += ["safetensors-header", "checksums-recorded"]
        return report
    if name == hf_trainer.WEIGHTS_BIN:
        report = Report(format=CheckpointFormat.HF_TRAINER)
        loaded = hf_trainer.torch_file(store, name, name, report, algorithm)
        if report.ok:
            labels = hf_trainer.torch_check_labels([loaded])
            report.checks += ["weights", "checksums-recorded", *labels]
        return report
    report = Report(format=CheckpointFormat.UNKNOWN)
    report.fail(Verdict.UNKNOWN, f"{name}: not a recognised checkpoint file")
    return report


def latest_valid(
    store: ObjectStore,
    algorithm: str = DEFAULT_ALGORITHM,
    on_checked: Callable[[int, int], None] | None = None,
) -> tuple[str | None, list[tuple[str, Report]]]:
    """Among the checkpoint folders directly under the store's root, the newest valid one.

    Newest by the step the format records (never by folder name); folders without a recorded
    step come last. Returns the chosen folder (or None) and every candidate checked, newest
    first, with its report: those before the chosen one say why they were rejected.
    ``on_checked(done, total)``: after each folder is verified (progress).
    """
    folders = sorted(_top_level(_listing(store, "")))
    reports: list[tuple[str, Report]] = []
    for folder in folders:
        reports.append((folder, verify(store, folder, algorithm)))
        if on_checked is not None:
            on_checked(len(reports), len(folders))
    reports.sort(key=lambda fr: (fr[1].step is not None, fr[1].step or 0, fr[0]), reverse=True)
    chosen = next((folder for folder, report in reports if report.ok), None)
    return chosen, reports
