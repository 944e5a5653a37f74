"""What the callback and the resume helpers both need of a Trainer job: the folder its
checkpoints go to, the config hash and data position they record, the processes' barrier."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import unquote, urlsplit

import torch
from transformers import TrainerState, TrainingArguments

from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.core.locations import job_folder
from ckpt_ha.sdk.protocol import Context, context

TORCH = frozenset({"torch"})
"""What a Trainer checkpoint holds: torch state (the environment records torch's version)."""

HF = CheckpointFormat.HF_TRAINER
LOADER = "ckpt_ha.sdk.hf"


MATH_ARGUMENTS = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "optim", "optim_args", "lr_scheduler_type", "lr_scheduler_kwargs",
    "warmup_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
    "num_train_epochs", "seed", "data_seed", "bf16", "fp16", "label_smoothing_factor",
    "average_tokens_across_devices",
)  # fmt: skip
"""The training arguments in the config hash: what changes the numbers a step computes (the
optimizer and its schedule, the batch each step sees, the seeds, the precision). Output paths,
logging, saving and evaluation settings are not in it; the world size is the topology's."""

VOLATILE_CONFIG = frozenset(
    {"transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype"}
)
"""Model-config keys left out of the config hash: the library version (the environment records
it), where the model was loaded from, and what ``save_pretrained`` fills in on the first save
(``architectures``, the dtype), which would change the hash between two checkpoints of one run.
The dtype the parameters really have is hashed instead."""


def output_dir(
    ctx: Context | None = None, *, root: str | None = None, job: str | None = None
) -> str:
    """``<storage root>/<job>``: where the Trainer's ``output_dir`` must point for ckpt-ha to see
    its checkpoints. Root and job come from the runner (``ctx`` or `context()`) unless given."""
    ctx = ctx if ctx is not None else context()
    root = root if root is not None else (ctx.storage_root if ctx is not None else None)
    job = job if job is not None else (ctx.job_id if ctx is not None else None)
    if root is None or job is None:
        raise ValueError(
            "no storage root or job: outside a runner (no $CKPT_HA_STORAGE_ROOT / $CKPT_HA_JOB) "
            "pass root= and job= explicitly"
        )
    if job_folder(job) != job:
        raise ValueError(
            f"job id {job!r} must be one path component (the job's own folder: no '/', "
            "whitespace, '.' or '..', not a reserved name)"
        )
    return str(local_folder(root) / job)


def local_folder(uri_or_path: str) -> Path:
    """The local folder a ``file://`` URI or a path names; the Trainer reads and writes only
    local (or mounted) folders."""
    parts = urlsplit(uri_or_path)
    if parts.scheme == "":
        return Path(uri_or_path)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(unquote(parts.path))
    raise ValueError(
        f"{uri_or_path} is not a local folder: the Trainer reads and writes checkpoints on a "
        "filesystem, so the storage root must be a path or a file:// URI (a mounted volume)"
    )


def config_hash(model: object, args: TrainingArguments) -> str:
    """``sha256:<hex>`` of the model config (without `VOLATILE_CONFIG`), the parameters' dtype
    and `MATH_ARGUMENTS`."""
    config = getattr(model, "config", None)
    described = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    doc = {
        "model": {k: v for k, v in described.items() if k not in VOLATILE_CONFIG},
        "dtype": str(getattr(model, "dtype", None)),
        "training": {name: getattr(args, name, None) for name in MATH_ARGUMENTS},
    }
    canonical = json.dumps(doc, sort_keys=True, default=str)
    return f"sha256:{hashlib.sha256(canonical.encode()).hexdigest()}"


def samples_seen(args: TrainingArguments, state: TrainerState, step: int) -> int:
    """The data position at ``step``: step x per-device batch x gradient accumulation x world
    size. Counts samples the steps were given; a short last batch of an epoch counts as full."""
    batch = state.train_batch_size or args.per_device_train_batch_size
    return int(step * batch * args.gradient_accumulation_steps * args.world_size)


def saves_under(args: TrainingArguments) -> Path:
    """The folder the Trainer writes ``checkpoint-<step>`` folders into (absolute)."""
    if args.output_dir is None:  # TrainingArguments fills in a default; never None in a run
        raise ValueError("TrainingArguments.output_dir is not set: use hf.output_dir()")
    return Path(args.output_dir).resolve()


def barrier(args: TrainingArguments) -> None:
    """Wait for every process of the job (nothing to wait for in a single process)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if args.world_size > 1 and distributed:
        torch.distributed.barrier()
