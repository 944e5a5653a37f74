"""Hugging Face Trainer ``checkpoint-<step>/`` folders, checked without unpickling anything.

What the Trainer writes: ``config.json``, the weights (``model.safetensors``, a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``), ``trainer_state.json`` (whose
``global_step`` is the step), and for an exact resume ``optimizer.pt``, ``scheduler.pt`` and
``rng_state*.pth``. Without optimizer and scheduler state the folder is valid as weights only,
and the report says so. ``.pt``/``.bin``/``.pth`` files (and a bare ``pytorch_model.bin``) are
checked for size and container magic and checksummed; when torch is installed they are also
loaded with ``torch.load(weights_only=True)`` (never without: a pickle runs code), so a file
needing a global outside torch's allow-list is unsafe. report.checks says which ran:
``torch-load:weights_only`` or ``torch-magic-only``.
"""

from __future__ import annotations

import json

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import safetensors, torch_load
from ckpt_ha.formats.paths import join
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import InvalidKey, ObjectNotFound, ObjectStore

MAX_JSON_BYTES = 64 * 1024 * 1024
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default container since PyTorch 1.6
PICKLE_MAGIC = b"\x80"  # the legacy format: a bare pickle stream
RESUME_STATE = ("optimizer.pt", "scheduler.pt")
WEIGHTS_BIN = "pytorch_model.bin"


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


def torch_file(
    store: ObjectStore, key: str, name: str, report: Report, algorithm: str = cs.DEFAULT_ALGORITHM
) -> bool:
    """Check one torch-pickled file; True when it was loaded with weights_only=True."""
    try:
        size = store.stat(key).size
    except InvalidKey:
        report.fail(Verdict.UNSAFE, f"{name}: resolves outside the checkpoint (symlink?)")
        return False
    if size == 0:
        report.fail(Verdict.CORRUPT, f"{name}: zero bytes")
        return False
    head = store.read_bytes(key, offset=0, length=4)
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        report.fail(Verdict.CORRUPT, f"{name}: neither a torch zip container nor a pickle")
        return False
    digest, read = cs.checksum(store, key, algorithm)
    report.bytes_read += read
    report.checksums[name] = digest
    if torch_load.torch_module() is None or size > torch_load.MAX_LOAD_BYTES:
        return False
    rng = name.rsplit("/", 1)[-1].startswith("rng_state")
    failure = torch_load.check(store.read_bytes(key), name, numpy_rng=rng)
    if failure is not None:
        report.fail(*failure)
    return True


def _torch_file(store: ObjectStore, prefix: str, name: str, report: Report, algorithm: str) -> bool:
    return torch_file(store, join(prefix, name), name, report, algorithm)


def torch_check_label(loaded: list[bool]) -> str:
    """``torch-load:weights_only`` when every torch file was loaded, else ``torch-magic-only``."""
    if all(loaded):
        return "torch-load:weights_only"
    if torch_load.torch_module() is None:
        return "torch-magic-only (torch not installed)"
    return f"torch-magic-only for {loaded.count(False)} file(s) over the load size limit"


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

    torch_files: list[str] = []
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
    elif WEIGHTS_BIN in names:
        torch_files.append(WEIGHTS_BIN)
    else:
        report.fail(Verdict.INCOMPLETE, "no model weights (model.safetensors, pytorch_model.bin)")

    resume_files = [n for n in names if n in RESUME_STATE or n.startswith("rng_state")]
    torch_files += sorted(resume_files)
    loaded = [_torch_file(store, prefix, name, report, algorithm) for name in torch_files]
    report.exact_resume = all(n in names for n in RESUME_STATE)
    if report.ok:
        report.checks += ["trainer-state", "config", "weights", "checksums-recorded"]
        if torch_files:
            report.checks.append(torch_check_label(loaded))
        if not report.exact_resume:
            report.checks.append("weights-only: no optimizer/scheduler state, not an exact resume")
    return report
