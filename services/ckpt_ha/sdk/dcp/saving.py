"""`save`: every rank writes its own DCP files, rank 0 writes the intent first and the commit
last, once every rank has reported its files (see the package doc). The intent is `intent`'s,
the commit `committing`'s; `async_save` and `prepare_async` (`background`) are re-exported here,
where they always were."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ckpt_ha.contracts.checkpoint import Topology
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.dcp.background import async_save, prepare_async
from ckpt_ha.sdk.dcp.committing import DcpSaved, finish, writer_for_folder
from ckpt_ha.sdk.dcp.group import Group
from ckpt_ha.sdk.dcp.intent import Request, SaveFailed, begin
from ckpt_ha.sdk.protocol import BusEndpoint, Context, context

__all__ = ["DcpSaved", "SaveFailed", "async_save", "prepare_async", "save"]


@marks.during("save")
def save(
    state_dict: dict[str, Any],
    *,
    step: int,
    job_id: str | None = None,
    storage_root: str | None = None,
    ctx: Context | None = None,
    process_group: dist.ProcessGroup | None = None,
    run_id: str | None = None,
    attempt: int | None = None,
    project: str | None = None,
    model_version: str | None = None,
    code_version: str | None = None,
    data_snapshot: str | None = None,
    config_hash: str | None = None,
    topology: Topology | None = None,
    exact_resume: bool = True,
    data_position: int | None = None,
    bus: BusEndpoint | None = None,
    writer: Callable[[str], FileSystemWriter] | None = None,
    clock: Clock = utc_now,
) -> DcpSaved:
    """Save ``state_dict`` with ``torch.distributed.checkpoint`` as checkpoint
    ``<job>/step-<step:08d>`` (``-a<attempt>`` on a later attempt) and commit it; call it on every
    rank of ``process_group`` (default: the default group; no group initialised: this process).

    Under a runner, ``job_id``, ``storage_root`` (``CKPT_HA_STORAGE_ROOT``), run, attempt, code
    version, topology, bus and environment default to the attempt's, so the identity compares
    identical with ``job.started``; without a topology the group's size is the world size.
    Rank 0's arguments decide. ``writer`` builds the ``FileSystemWriter`` for the folder (e.g.
    more threads); ``data_position`` is recorded in the commit.

    Returns the same `DcpSaved` on every rank. Raises `CheckpointExists` on every rank when the
    folder already holds files; when rank 0 cannot start (a wrong argument, storage), its error
    there and `SaveFailed` on the others; and `SaveFailed` on every rank when a rank could not
    write or check its files (no commit is written: readers see a write that never finished).
    """
    request = Request(
        step=step,
        job_id=job_id,
        storage_root=storage_root,
        ctx=ctx if ctx is not None else context(),
        run_id=run_id,
        attempt=attempt,
        project=project,
        model_version=model_version,
        code_version=code_version,
        data_snapshot=data_snapshot,
        config_hash=config_hash,
        topology=topology,
        exact_resume=exact_resume,
        data_position=data_position,
        bus=bus,
        clock=clock,
    )
    group = Group.of(process_group)
    target, commitment = begin(group, request)
    storage_writer = writer_for_folder(target, writer)
    metadata = dcp_save(
        state_dict,
        storage_writer=storage_writer,
        process_group=group.pg,
        no_dist=group.pg is None,
    )
    return finish(group, target, commitment, storage_writer, metadata)
