"""Hugging Face Trainer ``checkpoint-<step>/`` folders, checked without unpickling anything.

What the Trainer writes: ``config.json``, the weights (``model.safetensors``, a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``), ``trainer_state.json`` (whose
``global_step`` is the step), and for an exact resume ``optimizer.pt``, ``scheduler.pt`` and
``rng_state*.pth``. Without optimizer and scheduler state the folder is valid as weights only,
and the report says so. ``.pt``/``.bin``/``.pth`` files are checked for size and container
magic and checksummed, never loaded (a pickle runs code).
"""

from __future__ import annotations

import json

from contracts.checkpoint import CheckpointFormat
from services.shared.formats import checksum as cs
from services.shared.formats import safetensors
from services.shared.formats.paths import join
from services.shared.formats.report import Report, Verdict
from services.shared.storage import ObjectNotFound, ObjectStore

MAX_JSON_BYTES = 64 * 1024 * 1024
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default container since PyTorch 1.6
PICKLE_MAGIC = b"\x80"  # the legacy format: a bare pickle stream
RESUME_STATE = ("optimizer.pt", "scheduler.pt")


def _json(store: ObjectStore, key: str, name: str, report: Report) -> object:
    try:
        if store.stat(key).size > MAX_JSON_BYTES:
            report.fail(Verdict.CORRUPT, f"{name}: larger than {MAX_JSON_BYTES} bytes")
            return None
        return json.loads(store.read_bytes(key).decode("utf-8"))
    except ObjectNotFound:
        report.fail(Verdict.INCOMPLETE, f"{name}: missing")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        report.fail(Verdict.CORRUPT, f"{name}: not UTF-8 JSON ({exc})")
    return None


def _torch_file(store: ObjectStore, prefix: str, name: str, report: Report, algorithm: str) -> None:
    key = join(prefix, name)
    size = store.stat(key).size
    if size == 0:
        report.fail(Verdict.CORRUPT, f"{name}: zero bytes")
        return
    head = store.read_bytes(key, offset=0, length=4)
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        report.fail(Verdict.CORRUPT, f"{name}: neither a torch zip container nor a pickle")
        return
    digest, read = cs.checksum(store, key, algorithm)
    report.bytes_read += read
    report.checksums[name] = digest


def verify(
    store: ObjectStore, prefix: str, names: set[str], algorithm: str = cs.DEFAULT_ALGORITHM
) -> Report:
    report = Report(format=CheckpointFormat.HF_TRAINER)
    state = _json(store, join(prefix, "trainer_state.json"), "trainer_state.json", report)
    step = state.get("global_step") if isinstance(state, dict) else None
    if state is not None and not (isinstance(step, int) and step >= 0):
        report.fail(Verdict.CORRUPT, "trainer_state.json: no non-negative integer global_step")
    report.step = step if isinstance(step, int) else None
    folder = prefix.rstrip("/").rsplit("/", 1)[-1]
    named = folder.removeprefix("checkpoint-") if folder.startswith("checkpoint-") else None
    if named is not None and report.step is not None and named != str(report.step):
        report.fail(
            Verdict.CORRUPT, f"folder {folder} but trainer_state.json says step {report.step}"
        )
    config = _json(store, join(prefix, "config.json"), "config.json", report)
    if config is not None and not isinstance(config, dict):
        report.fail(Verdict.CORRUPT, "config.json: not a JSON object")

    if "model.safetensors.index.json" in names:
        sharded = safetensors.verify_sharded(
            store, prefix, "model.safetensors.index.json", algorithm
        )
        for reason in sharded.reasons:
            report.fail(sharded.verdict, reason)
        report.checksums.update(sharded.checksums)
        report.bytes_read += sharded.bytes_read
    elif "model.safetensors" in names:
        safetensors.verify_file(
            store, join(prefix, "model.safetensors"), "model.safetensors", report, algorithm
        )
    elif "pytorch_model.bin" in names:
        _torch_file(store, prefix, "pytorch_model.bin", report, algorithm)
    else:
        report.fail(Verdict.INCOMPLETE, "no model weights (model.safetensors, pytorch_model.bin)")

    resume_files = [n for n in names if n in RESUME_STATE or n.startswith("rng_state")]
    for name in sorted(resume_files):
        _torch_file(store, prefix, name, report, algorithm)
    report.exact_resume = all(n in names for n in RESUME_STATE)
    if report.ok:
        report.checks += ["trainer-state", "config", "weights", "checksums-recorded"]
        if not report.exact_resume:
            report.checks.append("weights-only: no optimizer/scheduler state, not an exact resume")
    return report
