"""One rank of a real ``torchrun --nproc_per_node 2`` job on gloo, for tests/integration/
test_sdk_dcp.py: runs every multi-rank scenario of `ckpt_ha.sdk.dcp` in one launch and writes
what this rank saw to ``<out>/rank-<r>.json`` for the test to check.

Usage (from the repository root, the runner's variables in the environment):
    python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/support/dcp_worker.py <out-dir>

Scenarios, in order: ``save`` (sync, two ranks), ``exists`` (the same step again), ``resume``
(of that checkpoint, into zeroed tensors), ``truncated`` (rank 1's shard cut short after the
commit, then resumed), ``async`` (a training step while the write is held back by a gate),
``plain`` (`sdk.save` under torchrun without a runner: one rank's part is refused).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ckpt_ha import sdk
from ckpt_ha.contracts.checkpoint import CheckpointFormat
from ckpt_ha.formats import sidecar
from ckpt_ha.sdk import dcp, protocol
from tests.support.resume_tools import plan_for
from tests.support.torch_tools import tensor_bits, training_state, zeroed_like

ROOT = Path(os.environ[protocol.STORAGE_ROOT])


def ctx_for(job: str, attempt: int = 1, plan: Any = None) -> sdk.Context:
    env = {**os.environ, protocol.JOB: job, protocol.ATTEMPT: str(attempt)}
    if plan is not None:
        env[protocol.RESUME_PLAN] = plan.model_dump_json()
    ctx = sdk.context(env)
    assert ctx is not None
    return ctx


def bits(state: dict[str, Any]) -> dict[str, str]:
    return tensor_bits(torch, state)


def zeroed(value: Any) -> Any:
    return zeroed_like(torch, value)


def planned(job: str, step: int) -> Any:
    """Rank 0 plays the restore-coordinator; every rank gets the same plan."""
    box = [plan_for(ROOT, job, step) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0].model_copy(update={"checkpoint_format": CheckpointFormat.TORCH_DCP.value})


def scenario_save(report: dict[str, Any]) -> dict[str, Any]:
    state = training_state(torch, step=10)
    saved = dcp.save(state, step=10, ctx=ctx_for("job-save"))
    folder = Path(saved.uri.removeprefix("file://"))
    report["save"] = {
        "checkpoint_id": saved.checkpoint_id,
        "uri": saved.uri,
        "files": sorted(saved.commit.files),
        "own_files": sorted(p.name for p in folder.glob(f"__{dist.get_rank()}_*.distcp")),
    }
    return state


def scenario_exists(report: dict[str, Any], state: dict[str, Any]) -> None:
    """The same step again: rank 0 finds the folder taken, every rank raises."""
    try:
        dcp.save(state, step=10, ctx=ctx_for("job-save"))
    except sdk.CheckpointExists as exc:
        report["exists"] = exc.uri
    else:
        report["exists"] = None


def scenario_resume(report: dict[str, Any], saved_state: dict[str, Any]) -> None:
    plan = planned("job-save", 10)
    target = zeroed(training_state(torch, step=10))
    resumed = dcp.resume(
        target,
        ctx=ctx_for("job-save", 2, plan),
        describe=lambda s: (int(s["step"]) * 4, sdk.fingerprint(s["extra"]["note"])),
    )
    assert resumed is not None
    report["resume"] = {
        "plan_id": plan.plan_id,
        "checkpoint_id": plan.checkpoint_id,
        "step": resumed.step,
        "checksums_verified": resumed.checksums_verified,
        "bit_exact": bits(target) == bits(saved_state),
        "compared": len(bits(saved_state)),
    }


def scenario_truncated(report: dict[str, Any]) -> None:
    saved = dcp.save(training_state(torch, step=20), step=20, ctx=ctx_for("job-trunc"))
    dist.barrier()
    shard = Path(saved.uri.removeprefix("file://")) / "__1_0.distcp"
    if dist.get_rank() == 0:
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])
    dist.barrier()
    plan = planned("job-trunc", 20)
    try:
        dcp.resume(zeroed(training_state(torch, step=20)), ctx=ctx_for("job-trunc", 2, plan))
    except sdk.ResumeFailed as exc:
        report["truncated"] = {"plan_id": plan.plan_id, "raised": str(exc)}
    else:
        report["truncated"] = {"plan_id": plan.plan_id, "raised": None}


class GatedWriter(FileSystemWriter):
    """DCP's own writer, holding its data writes until the test opens the gate."""

    gate = threading.Event()

    def write_data(self, plan: Any, planner: Any) -> Any:
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the gate never opened")
        return super().write_data(plan, planner)


def scenario_async(report: dict[str, Any]) -> None:
    torch.manual_seed(1)
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = bits({"model": model.state_dict()})
    handle = dcp.async_save(
        {"model": model.state_dict()},
        step=30,
        ctx=ctx_for("job-async"),
        writer=GatedWriter,
    )
    in_flight = not handle.done()
    model(torch.randn(8, 64)).pow(2).sum().backward()  # a training step during the save
    optimizer.step()
    stepped = bits({"model": model.state_dict()}) != before
    folder = ROOT / "job-async" / "step-00000030"
    during = sorted(p.name for p in folder.iterdir())
    still_in_flight = not handle.done()
    GatedWriter.gate.set()
    saved = handle.result(timeout=60)
    after = sorted(p.name for p in folder.iterdir())
    back = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    dcp_load(back, checkpoint_id=str(folder))
    report["async"] = {
        "checkpoint_id": saved.checkpoint_id,
        "in_flight_after_return": in_flight,
        "stepped_while_in_flight": stepped and still_in_flight,
        "files_while_held": during,
        "files_after": after,
        "commit_files": sorted(saved.commit.files),
        "saved_the_pre_step_state": bits(back) == before,
    }


def scenario_plain(report: dict[str, Any]) -> None:
    """Plain torchrun, no runner: every rank calls `sdk.save` with its own part. Each is refused
    (torchrun's WORLD_SIZE/RANK say there are two); rank 0 saves a whole state that says so."""
    kept = {name: os.environ.pop(name) for name in (protocol.JOB,) if name in os.environ}
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    try:
        assert sdk.context() is None
        try:
            sdk.save(str(ROOT), "job-plain", 5, {"part": torch.full((2,), float(rank))},
                     run_id="plain-1")  # fmt: skip
        except sdk.PartialSave as exc:
            out["refused"] = {"source": exc.source, "rank": exc.rank, "world": exc.world_size}
        dist.barrier()
        if rank == 0:
            saved = sdk.save(str(ROOT), "job-plain", 6, {"all": torch.ones(2)}, run_id="plain-1",
                             whole_state=True)  # fmt: skip
            out["whole"] = {"uri": saved.uri, "whole_state": saved.manifest.whole_state}
        dist.barrier()
    finally:
        os.environ.update(kept)
    report["plain"] = out


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report: dict[str, Any] = {"rank": rank}
    try:
        saved_state = scenario_save(report)
        scenario_exists(report, saved_state)
        scenario_resume(report, saved_state)
        scenario_truncated(report)
        scenario_async(report)
        scenario_plain(report)
        assert sidecar.COMMIT in report["async"]["files_after"]
        # Both ranks done before either tears gloo down: a rank that destroys its process
        # group while the other still has gloo work in flight can abort the other's process.
        dist.barrier()
    finally:
        (out / f"rank-{rank}.json").write_text(json.dumps(report, indent=2))
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
