"""`async_save` and `prepare_async`: a DCP save whose files are written and committed while
training goes on (see the package doc)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.stateful import Stateful

from ckpt_ha.contracts.checkpoint import Topology
from ckpt_ha.core.clock import Clock, utc_now
from ckpt_ha.sdk import marks
from ckpt_ha.sdk.dcp.committing import DcpSaved, finish, writer_for_folder
from ckpt_ha.sdk.dcp.group import Group
from ckpt_ha.sdk.dcp.intent import Commitment, Request, Target, begin
from ckpt_ha.sdk.protocol import BusEndpoint, Context, context


@dataclass
class _Background:
    """This process's background saving: the group it runs on, the save in flight, and the
    stager that copies the state to CPU memory."""

    world: object = None
    """The default group the checkpoint group was made for (a new one needs a new group)."""
    group: dist.ProcessGroup | None = None
    in_flight: Future[DcpSaved] | None = None
    stager: DefaultStager | None = None
    """Kept between saves: it keeps its CPU copies of the tensors (DCP's staging cache), so a
    save after the first only copies into them instead of allocating them again."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    committer: ThreadPoolExecutor | None = None
    """One long-lived thread that waits for each upload and commits it: handing a save to it
    costs the loop no thread start (`prepare_async` starts it)."""

    def commit_thread(self) -> ThreadPoolExecutor:
        if self.committer is None:  # its thread is joined at exit: a commit is never cut short
            self.committer = ThreadPoolExecutor(1, thread_name_prefix="ckpt-ha-dcp-commit")
        return self.committer

    def staging(self) -> DefaultStager:
        if self.stager is None:
            accelerator = torch.accelerator.is_available()
            self.stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=accelerator,
                    use_shared_memory=False,
                    use_async_staging=False,  # the state is copied before async_save returns
                    use_non_blocking_copy=False,
                )
            )
        return self.stager


_BACKGROUND = _Background()


def _as_state(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each `Stateful` value's own state dict, as ``dcp.async_save`` stages
    it: its staging copy is made of the tensors, never of the objects that hold them (a
    model wrapper, a data loader holding a lock)."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


def _background_group(process_group: dist.ProcessGroup | None) -> Group:
    """The group the background collectives run on: ``process_group``, else a gloo group of all
    ranks made once (a collective call) and kept, so that they never interleave with the
    training loop's own collectives on the default group."""
    if process_group is not None or not (dist.is_available() and dist.is_initialized()):
        return Group(process_group)
    world = dist.group.WORLD
    if _BACKGROUND.group is None or _BACKGROUND.world is not world:
        group = dist.new_group(backend="gloo")
        if not isinstance(group, dist.ProcessGroup):  # this rank is not in the default group
            raise RuntimeError("async_save must be called on every rank of the default group")
        _BACKGROUND.group, _BACKGROUND.world = group, world
    return Group(_BACKGROUND.group)


def prepare_async(state_dict: dict[str, Any]) -> None:
    """Allocate the CPU copy `async_save` stages the state into, now, so that the first
    `async_save` only copies into it as later ones do (the allocation, pinned memory with an
    accelerator, is the first save's extra stall). Call it once the model and optimizer state
    exist (e.g. after the first optimizer step, when the optimizer has its state), with the
    state dict later saves will pass; it copies the state once and writes nothing. Optional:
    without it, the first `async_save` allocates."""
    with _BACKGROUND.lock:
        previous = _BACKGROUND.in_flight
        if previous is not None:
            wait_for_futures([previous])  # the stager is not thread-safe
        _BACKGROUND.staging().stage(_as_state(state_dict))
        _BACKGROUND.commit_thread().submit(lambda: None).result()  # its thread started now


def _finish_in_background(
    upload: Future[Metadata],
    group: Group,
    target: Target,
    commitment: Commitment | None,
    storage_writer: FileSystemWriter,
    done: Future[DcpSaved],
) -> None:
    try:
        if commitment is not None:  # off the training loop: a bus round trip, or its timeout
            commitment = commitment.announce_writing()
        metadata = upload.result()  # DCP's own collectives: it fails on every rank or on none
        done.set_result(finish(group, target, commitment, storage_writer, metadata))
    except BaseException as exc:  # noqa: BLE001 -- delivered through the future, not lost
        done.set_exception(exc)


@marks.during("save")
def async_save(
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
) -> Future[DcpSaved]:
    """`save` on top of ``dcp.async_save``: returns once the intent is written and the state is
    staged (copied to CPU memory), so training goes on while the files are written (waited
    for and committed by one long-lived thread of this process, which also announces
    ``checkpoint.writing``: a connection to the bus per event, or its timeout when the bus is
    down, never stalls the loop); the future
    completes with `DcpSaved` once every rank's files are durable and the commit is written
    (or fails with `SaveFailed` / DCP's error, and nothing is committed).

    The CPU copy is kept between saves (DCP's staging cache, one copy of the state in memory):
    the first save allocates it, unless `prepare_async` did beforehand; later saves only copy
    into it.

    Call it on every rank. The background collectives (DCP's and the commit's) run on
    ``process_group``, which nothing else may use meanwhile; by default on a gloo group of all
    ranks, made on the first call (all ranks make that call together, as with any new group).
    A save waits for the previous one of this process to finish first, so saves and their
    collectives never overlap.
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
    with _BACKGROUND.lock:
        previous = _BACKGROUND.in_flight
        if previous is not None:
            wait_for_futures([previous])
        group = _background_group(process_group)
        target, commitment = begin(group, request, announce=False)
        storage_writer = writer_for_folder(target, writer)
        staged = dcp_async_save(
            state_dict,
            storage_writer=storage_writer,
            process_group=group.pg,
            async_stager=_BACKGROUND.staging(),
            no_dist=group.pg is None,
        )
        upload = staged.upload_completion if isinstance(staged, AsyncSaveResponse) else staged
        done: Future[DcpSaved] = Future()
        done.set_running_or_notify_cancel()  # a commit cannot be called off halfway
        _BACKGROUND.commit_thread().submit(
            _finish_in_background,
            cast(Future[Metadata], upload),
            group,
            target,
            commitment,
            storage_writer,
            done,
        )
        _BACKGROUND.in_flight = done
    return done
