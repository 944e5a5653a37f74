"""R14/R18: whether a checkpoint written at one parallel shape loads at another, by format.

A topology difference between the checkpoint and the restore target is decided by what the
checkpoint's format can do, not only by a rule the job declared:

* PyTorch DCP reshards across world sizes: every tensor is saved with its global shape and
  its shards' offsets, and ``dcp.load`` reads whatever each rank of the new world needs →
  compatible, "reshard N→M";
* a native ckpt-ha checkpoint holds one process's whole state (a multi-rank one is valid only
  when its manifest says so, `ckpt_ha.formats.native.missing_ranks`) → loads at any world size;
* a Hugging Face Trainer folder holds the whole model's weights, which load at any world size;
  under DDP its optimizer state is whole too (replicated on every rank). Under FSDP or
  DeepSpeed ZeRO the Trainer saves the optimizer state (and, for ZeRO-3, the weights) per rank,
  which load only at the same world size unless converted (DeepSpeed's universal checkpoint,
  FSDP's full state dict): the format cannot tell which was used, so the reason says it;
* anything else (safetensors parts, unknown layouts) may hold per-rank parts the format cannot
  reshard → unknown, with the next step.

A change of tensor or pipeline parallelism is never decided here: only a declared rule allows
it (a model-parallel layout changes what each part holds, not just who reads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_ha.contracts.checkpoint import CheckpointFormat, Topology


@dataclass(frozen=True)
class ShapeVerdict:
    loads: bool
    """True: the format loads the checkpoint at the target's world size."""
    reason: str


def world_change(written: Topology | None, target: Topology | None) -> tuple[int, int] | None:
    """``(written, target)`` world sizes when only the world size differs (the same tensor and
    pipeline parallelism); None when both are unknown, equal, or more than that differs."""
    if written is None or target is None or written == target:
        return None
    same_layout = (written.tensor_parallel, written.pipeline_parallel) == (
        target.tensor_parallel,
        target.pipeline_parallel,
    )
    if not same_layout or written.world_size == target.world_size:
        return None
    return written.world_size, target.world_size


def across(
    checkpoint_format: str | None, written: Topology | None, target: Topology | None
) -> ShapeVerdict | None:
    """What the format says about loading at the target's world size; None when the topology
    difference is not a world-size change alone (a declared rule decides, or nothing does)."""
    change = world_change(written, target)
    if change is None:
        return None
    old, new = change
    shift = f"{old}→{new}"
    if checkpoint_format == CheckpointFormat.TORCH_DCP:
        return ShapeVerdict(
            True,
            f"reshard {shift}: DCP saves every tensor with its global shape and loads it at any "
            "world size",
        )
    if checkpoint_format == CheckpointFormat.NATIVE:
        return ShapeVerdict(
            True, f"world size {shift}: a native checkpoint holds the whole state, for any world"
        )
    if checkpoint_format == CheckpointFormat.HF_TRAINER:
        return ShapeVerdict(
            True,
            f"world size {shift}: the Trainer folder's weights load at any world size, and so "
            "does its optimizer state under DDP (replicated); under FSDP or DeepSpeed ZeRO the "
            "optimizer state is saved per rank and loads only at the world size it was written "
            "with: convert it first (DeepSpeed's universal checkpoint, FSDP's full state dict)",
        )
    return ShapeVerdict(
        False,
        f"world size {shift}: a {checkpoint_format or 'unknown'} checkpoint may hold per-rank "
        "parts its format cannot reshard; next step: relaunch at world size "
        f"{old}, or convert it and declare the change (a compatibility rule on topology)",
    )
