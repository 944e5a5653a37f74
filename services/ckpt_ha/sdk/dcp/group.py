"""The processes that save or load a checkpoint together, and the few collectives they need."""

from __future__ import annotations

from typing import TypeVar

import torch.distributed as dist

T = TypeVar("T")


class Group:
    """The processes saving or loading together: a process group, or this process alone."""

    def __init__(self, pg: dist.ProcessGroup | None) -> None:
        self.pg = pg
        self.rank = dist.get_rank(pg) if pg is not None else 0
        self.size = dist.get_world_size(pg) if pg is not None else 1

    @classmethod
    def of(cls, process_group: dist.ProcessGroup | None) -> Group:
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        return cls(process_group)

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        if self.pg is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.pg, 0), group=self.pg)
        return box[0]

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value`` on rank 0 (in rank order); [] elsewhere."""
        if self.pg is None:
            return [value]
        out: list[T] | None = [value] * self.size if self.rank == 0 else None
        dist.gather_object(value, out, dst=dist.get_global_rank(self.pg, 0), group=self.pg)
        return out or []

    def all_gather(self, value: T) -> list[T]:
        if self.pg is None:
            return [value]
        out: list[T] = [value] * self.size
        dist.all_gather_object(out, value, group=self.pg)
        return out
