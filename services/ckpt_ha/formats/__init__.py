"""Checkpoint formats: recognise a layout on storage and verify it. One layer, used by the
services and by `ckpt-ha verify`.

Recognised and verified: the native ckpt-ha manifest, safetensors (single and sharded),
Hugging Face Trainer folders and PyTorch Distributed Checkpoint (DCP) folders. Pickled content
is never unpickled unrestricted: DCP metadata goes through a restricted unpickler (`dcp`), and
torch files are loaded only with ``weights_only=True`` when torch is installed (`torch_load`).
"""

from __future__ import annotations

from pathlib import Path

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import dcp, hf_trainer, native, safetensors
from ckpt_ha.formats.checksum import DEFAULT_ALGORITHM
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import FsStore, ObjectStore, StorageError

__all__ = ["Report", "Verdict", "detect", "latest_valid", "verify", "verify_path"]


def _top_level(store: ObjectStore, prefix: str) -> set[str]:
    base = f"{prefix.rstrip('/')}/" if prefix else ""
    names = set()
    for info in store.list(base):
        names.add(info.key[len(base) :].split("/", 1)[0])
    return names


def detect(names: set[str]) -> CheckpointFormat:
    if native.MANIFEST in names:
        return CheckpointFormat.NATIVE
    if ".metadata" in names or any(n.endswith(".distcp") for n in names):
        return CheckpointFormat.TORCH_DCP
    if "trainer_state.json" in names:
        return CheckpointFormat.HF_TRAINER
    if any(n.endswith((".safetensors", safetensors.INDEX_SUFFIX)) for n in names):
        return CheckpointFormat.SAFETENSORS
    return CheckpointFormat.UNKNOWN


def verify(store: ObjectStore, prefix: str, algorithm: str = DEFAULT_ALGORITHM) -> Report:
    """Verify the checkpoint folder at ``prefix``.

    Permanent storage errors become a verdict; a transient one (`StorageUnavailable`) is raised,
    because an outage says nothing about the checkpoint.
    """
    names = _top_level(store, prefix)
    fmt = detect(names)
    try:
        if fmt is CheckpointFormat.NATIVE:
            return native.verify(store, prefix)
        if fmt is CheckpointFormat.SAFETENSORS:
            return _verify_safetensors_folder(store, prefix, names, algorithm)
        if fmt is CheckpointFormat.HF_TRAINER:
            return hf_trainer.verify(store, prefix, names, algorithm)
        if fmt is CheckpointFormat.TORCH_DCP:
            return dcp.verify(store, prefix, names, algorithm)
    except StorageError as exc:
        if exc.transient:
            raise  # an outage is not a verdict on the checkpoint: the caller retries
        report = Report(format=fmt)
        report.fail(Verdict.INCOMPLETE, f"storage error while verifying: {exc}")
        return report
    report = Report(format=fmt)
    if fmt is CheckpointFormat.UNKNOWN:
        report.fail(Verdict.UNKNOWN, "no recognised checkpoint layout")
    else:
        report.fail(Verdict.UNKNOWN, f"{fmt.value} layout recognised; its checks are not built yet")
    return report


def _verify_safetensors_folder(
    store: ObjectStore, prefix: str, names: set[str], algorithm: str
) -> Report:
    indexes = sorted(n for n in names if n.endswith(safetensors.INDEX_SUFFIX))
    if len(indexes) > 1:
        report = Report(format=CheckpointFormat.SAFETENSORS)
        report.fail(Verdict.CORRUPT, f"several index files: {indexes}")
        return report
    if indexes:
        return safetensors.verify_sharded(store, prefix, indexes[0], algorithm)
    report = Report(format=CheckpointFormat.SAFETENSORS)
    for name in sorted(n for n in names if n.endswith(".safetensors")):
        key = f"{prefix.rstrip('/')}/{name}" if prefix else name
        safetensors.verify_file(store, key, name, report, algorithm)
    if report.ok:
        report.checks += ["safetensors-header", "checksums-recorded"]
    return report


def verify_path(path: Path, algorithm: str = DEFAULT_ALGORITHM) -> Report:
    """Offline verdict for a local folder or single file (what `ckpt-ha verify` prints)."""
    if path.is_dir():
        return verify(FsStore(path), "", algorithm)
    store = FsStore(path.parent)
    if path.name.endswith(".safetensors"):
        report, _ = safetensors.verify_file(store, path.name, path.name, None, algorithm)
        if report.ok:
            report.checks += ["safetensors-header", "checksums-recorded"]
        return report
    if path.name == hf_trainer.WEIGHTS_BIN:
        report = Report(format=CheckpointFormat.HF_TRAINER)
        loaded = hf_trainer.torch_file(store, path.name, path.name, report, algorithm)
        if report.ok:
            label = hf_trainer.torch_check_label([loaded])
            report.checks += ["weights", "checksums-recorded", label]
        return report
    report = Report(format=CheckpointFormat.UNKNOWN)
    report.fail(Verdict.UNKNOWN, f"{path.name}: not a recognised checkpoint file")
    return report


def latest_valid(
    store: ObjectStore, algorithm: str = DEFAULT_ALGORITHM
) -> tuple[str | None, list[tuple[str, Report]]]:
    """Among the checkpoint folders directly under the store's root, the newest valid one.

    Newest by the step the format records (never by folder name); folders without a recorded
    step come last. Returns the chosen folder (or None) and every candidate checked, newest
    first, with its report: those before the chosen one say why they were rejected.
    """
    folders = sorted(_top_level(store, ""))
    reports = [(folder, verify(store, folder, algorithm)) for folder in folders]
    reports.sort(key=lambda fr: (fr[1].step is not None, fr[1].step or 0, fr[0]), reverse=True)
    chosen = next((folder for folder, report in reports if report.ok), None)
    return chosen, reports
