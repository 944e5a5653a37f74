"""Hugging Face Trainer ``checkpoint-<step>/`` folders, checked without unpickling anything.

What ``Trainer._save_checkpoint`` writes (transformers 4.x-5.x), in this order, in place (no
temp folder, no rename): the weights through ``save_pretrained`` (``config.json``,
``generation_config.json``, ``model.safetensors`` or its shards then their index, or
``pytorch_model.bin``) and ``training_args.bin``; then ``optimizer.pt``, ``scheduler.pt``
(``scaler.pt``), ``rng_state.pth`` (``rng_state_<rank>.pth`` per rank when distributed); and
**last** ``trainer_state.json``, whose ``global_step`` is the step. So a folder that looks like
a Trainer's (`is_trainer_folder`) without a readable ``trainer_state.json`` is a save that has
not finished (or never will): incomplete, never valid as bare safetensors.

Without optimizer, scheduler or RNG state the folder is valid as weights only (not an exact
resume), and the report says so. ``.pt``/``.bin``/``.pth`` files (and a bare
``pytorch_model.bin``) are checked for container magic and checksummed, and their pickle is
always read by the restricted unpickler (`torch_pickle`: only the zip's ``data.pkl``, so at any
file size): a global outside torch's weights-only allow-list makes the file unsafe. When torch
is installed, files up to `limits.MAX_LOAD_BYTES` are also loaded with
``torch.load(weights_only=True)`` (never without: a pickle runs code). report.checks says what
ran: ``torch-pickle:restricted`` always, and ``torch-load:weights_only`` or why not.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Iterable
from contextvars import copy_context

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import checksum as cs
from ckpt_ha.formats import jsondoc, limits, parallel, safetensors, torch_load, torch_pickle
from ckpt_ha.formats.paths import folder_name, join
from ckpt_ha.formats.report import Report, Verdict
from ckpt_ha.storage import InvalidKey, ObjectNotFound, ObjectStore

MAX_JSON_BYTES = limits.MAX_TRAINER_JSON_BYTES
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default container since PyTorch 1.6
PICKLE_MAGIC = b"\x80"  # the legacy format: a bare pickle stream
RESUME_STATE = ("optimizer.pt", "scheduler.pt")
WEIGHTS_BIN = "pytorch_model.bin"
STATE = "trainer_state.json"
"""Written last by ``Trainer._save_checkpoint``: the Trainer's commit marker."""
TRAINER_ONLY = frozenset({*RESUME_STATE, "scaler.pt", "training_args.bin", STATE})
"""Files only a Trainer's save writes (besides ``rng_state*.pth``)."""
CHECKPOINT_FOLDER = re.compile(r"checkpoint-\d{1,15}")
"""At most 15 digits: a step an event can carry (below 2**53)."""
ZIP_END = b"PK\x05\x06"
ZIP64_LOCATOR = b"PK\x06\x07"
ZIP_END_BYTES = 22
ZIP64_LOCATOR_BYTES = 20


def is_rng_state(name: str) -> bool:
    return name.startswith("rng_state") and name.endswith(".pth")


def is_trainer_folder(folder: str, names: Iterable[str]) -> bool:
    """Named ``checkpoint-<n>``, or holding a file only a Trainer's save writes."""
    return CHECKPOINT_FOLDER.fullmatch(folder) is not None or any(
        name in TRAINER_ONLY or is_rng_state(name) for name in names
    )


def global_step(data: bytes) -> int | None:
    """The ``global_step`` of a ``trainer_state.json`` (an integer in 0 .. 2**53-1), else None
    (also while the file is still being written: it is not JSON before its last brace)."""
    try:
        doc = jsondoc.parse(data)
    except jsondoc.JsonInvalid:
        return None
    return jsondoc.count(doc.get("global_step")) if isinstance(doc, dict) else None


def torch_file_complete(store: ObjectStore, key: str, size: int) -> bool:
    """Whether a ``torch.save`` file is finished: its zip container's end record (written last,
    after the central directory) closes the file. A file that is no zip container (a legacy
    bare pickle, or not a torch file at all) has no such record: it counts as finished at any
    size, and verification judges it."""
    head = store.read_bytes(key, offset=0, length=min(size, 4))
    if len(head) < 4:
        return False
    if not head.startswith(ZIP_MAGIC):
        return True
    if size < ZIP_END_BYTES:
        return False
    end = store.read_bytes(key, offset=size - ZIP_END_BYTES, length=ZIP_END_BYTES)
    if not end.startswith(ZIP_END):
        return False
    cd_size, cd_offset, comment = struct.unpack("<IIH", end[12:])
    if comment == 0 and cd_offset + cd_size == size - ZIP_END_BYTES:
        return True
    # zip64 (torch always writes it): its locator sits right before the end record
    locator = size - ZIP_END_BYTES - ZIP64_LOCATOR_BYTES
    return locator >= 0 and store.read_bytes(key, offset=locator, length=4) == ZIP64_LOCATOR


def _json(store: ObjectStore, key: str, name: str, report: Report) -> object:
    try:
        if store.stat(key).size > MAX_JSON_BYTES:
            report.fail(Verdict.CORRUPT, f"{name}: larger than {MAX_JSON_BYTES} bytes")
            return None
        return jsondoc.parse(store.read_bytes(key))
    except ObjectNotFound:
        report.fail(Verdict.INCOMPLETE, f"{name}: missing")
    except jsondoc.JsonInvalid as exc:
        report.fail(Verdict.CORRUPT, f"{name}: not UTF-8 JSON ({exc})")
    return None


def torch_file(
    store: ObjectStore,
    key: str,
    name: str,
    report: Report,
    algorithm: str = cs.DEFAULT_ALGORITHM,
    *,
    trial_load: bool = True,
) -> bool:
    """Check one torch-pickled file: its pickle always (restricted, any size), and a load with
    weights_only=True when ``trial_load``, torch is installed and the file is at most
    `limits.MAX_LOAD_BYTES`; True when that load ran."""
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
    rng = is_rng_state(name.rsplit("/", 1)[-1])
    failure = torch_pickle.check(store, key, name, length=size, numpy_rng=rng)
    if failure is not None:
        report.fail(*failure)
        return False
    if not trial_load or torch_load.torch_module() is None or size > torch_load.MAX_LOAD_BYTES:
        return False
    failure = _trial_load(store, key, name, rng)
    if failure is not None:
        report.fail(*failure)
    return True


def _trial_load(store: ObjectStore, key: str, name: str, rng: bool) -> tuple[Verdict, str] | None:
    """``torch.load(weights_only=True)`` of the file: mapped where the store can hand the file
    over under a read lease, all of it in the page cache (a local file just hashed), else from
    its bytes."""
    with store.open_read(key) as stream:
        leased = getattr(stream, "leased_path", None)
        if leased is not None:
            with leased() as path:
                if path is not None:
                    return torch_load.check_file(path, name, numpy_rng=rng)
    return torch_load.check(store.read_bytes(key), name, numpy_rng=rng)


def _torch_files(
    store: ObjectStore,
    prefix: str,
    names: list[str],
    report: Report,
    algorithm: str,
    *,
    trial_load: bool,
) -> list[bool]:
    """`torch_file` of each, side by side (each read for its checksum and its pickle on its own
    thread), each into a report of its own, added to ``report`` in the order of ``names``."""

    def check(name: str) -> tuple[bool, Report]:
        own = Report(format=report.format)
        loaded = torch_file(store, join(prefix, name), name, own, algorithm, trial_load=trial_load)
        return loaded, own

    context = copy_context()  # the read observer and `checksum.hashed_first` reach the pool
    results = parallel.run([functools.partial(context.copy().run, check, name) for name in names])
    for _, own in results:
        for reason in own.reasons:
            report.fail(own.verdict, reason)
        report.checksums.update(own.checksums)
        report.bytes_read += own.bytes_read
    return [loaded for loaded, _ in results]


def torch_check_labels(loaded: list[bool], *, trial_load: bool = True) -> list[str]:
    """``torch-pickle:restricted`` (every torch file's pickle, always), then
    ``torch-load:weights_only`` when every file was also loaded, else why not."""
    labels = ["torch-pickle:restricted"]
    if all(loaded):
        labels.append("torch-load:weights_only")
    elif not trial_load:
        labels.append("torch-load:left to the loader")
    elif torch_load.torch_module() is None:
        labels.append("torch-load:not-run (torch not installed)")
    else:
        over = loaded.count(False)
        labels.append(f"torch-load:not-run for {over} file(s) over {limits.MAX_LOAD_BYTES} bytes")
    return labels


def verify(
    store: ObjectStore,
    prefix: str,
    names: set[str],
    algorithm: str = cs.DEFAULT_ALGORITHM,
    *,
    trial_load: bool = True,
) -> Report:
    report = Report(format=CheckpointFormat.HF_TRAINER)
    folder = folder_name(store, prefix)
    named = folder.removeprefix("checkpoint-") if CHECKPOINT_FOLDER.fullmatch(folder) else None
    if STATE not in names:
        # The step the folder's name gives, so that `latest_valid` lists it where it belongs.
        report.step = int(named) if named is not None else None
        present = sorted(n for n in names if n in TRAINER_ONLY or is_rng_state(n))
        report.fail(
            Verdict.INCOMPLETE,
            f"{STATE} is missing: the Trainer writes it last, so this save never finished"
            + (f" (has {', '.join(present)})" if present else ""),
        )
        return report
    state = _json(store, join(prefix, STATE), STATE, report)
    step = jsondoc.count(state.get("global_step")) if isinstance(state, dict) else None
    if state is not None and step is None:
        report.fail(Verdict.CORRUPT, f"{STATE}: no integer global_step in 0 .. 2**53-1")
    report.step = step
    if named is not None and report.step is not None and named != str(report.step):
        report.fail(Verdict.CORRUPT, f"folder {folder} but {STATE} says step {report.step}")
    config = _json(store, join(prefix, "config.json"), "config.json", report)
    if config is not None and not isinstance(config, dict):
        report.fail(Verdict.CORRUPT, "config.json: not a JSON object")

    rng = sorted(n for n in names if is_rng_state(n))
    resume = [n for n in RESUME_STATE if n in names] + rng
    sharded = any(n.endswith(safetensors.INDEX_SUFFIX) for n in names)
    weights = sorted(n for n in names if n.endswith(".safetensors")) or [
        n for n in names if n == WEIGHTS_BIN
    ]
    hashed = ([] if sharded else weights) + resume  # the files the checks below hash
    with cs.hashed_first(store, [join(prefix, n) for n in hashed], algorithm):
        _check_files(store, prefix, names, report, algorithm, resume, trial_load=trial_load)
    return report


def _check_files(
    store: ObjectStore,
    prefix: str,
    names: set[str],
    report: Report,
    algorithm: str,
    resume: list[str],
    *,
    trial_load: bool,
) -> None:
    """The weights and the resume state: each file's own checks, and the report's labels."""
    torch_files: list[str] = []
    if any(n.endswith((".safetensors", safetensors.INDEX_SUFFIX)) for n in names):
        weights = safetensors.verify_folder(store, prefix, names, algorithm)
        for reason in weights.reasons:
            report.fail(weights.verdict, reason)
        report.checksums.update(weights.checksums)
        report.bytes_read += weights.bytes_read
    elif WEIGHTS_BIN in names:
        torch_files.append(WEIGHTS_BIN)
    else:
        report.fail(Verdict.INCOMPLETE, "no model weights (model.safetensors, pytorch_model.bin)")

    torch_files += resume
    loaded = _torch_files(store, prefix, torch_files, report, algorithm, trial_load=trial_load)
    rng = any(is_rng_state(n) for n in resume)
    absent = [n for n in RESUME_STATE if n not in names] + ([] if rng else ["rng_state*.pth"])
    report.exact_resume = not absent
    if report.ok:
        report.checks += ["trainer-state", "config", "weights", "checksums-recorded"]
        if torch_files:
            report.checks += torch_check_labels(loaded, trial_load=trial_load)
        if absent:
            report.checks.append(
                f"weights-only: no {', '.join(absent)} (optimizer/scheduler/RNG state), "
                "not an exact resume"
            )
