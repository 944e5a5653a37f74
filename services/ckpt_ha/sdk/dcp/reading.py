"""Loading a DCP tensor straight into its target: what `resume`'s reader does instead of DCP's
own read where it can (issue 32: a verified restore at the speed of a plain one).

DCP's ``FileSystemReader`` loads each stored tensor with ``torch.load`` into new memory, then
copies it into the state dict's tensor: every byte is faulted into fresh pages, read, and copied
once more. When the stored tensor is exactly the target (same dtype and shape, both contiguous,
no transform, this machine's byte order), its bytes are read with ``readinto`` straight into the
target's memory instead: the stored tensor's description (``data.pkl``, restricted to
``weights_only``) is loaded on the ``meta`` device, which reads no data and gives where its
bytes start. Anything else (a resharded slice, a dtype conversion, a non-contiguous tensor,
"bytes" items) is left to DCP's own read.

A file whose checksum this rank is to verify is hashed during that same read (`FileHash`): the
bytes between the tensors (headers, anything DCP's own read loads) are read and hashed in file
order, each tensor's bytes are hashed `PIECE_BYTES` at a time just after they land in the
target, while they are still in the CPU cache. The bytes cross memory once for the load and
the check together, instead of a second full pass beside the load (which, memory-bound on the
same cores, cost as much as running after it).
"""

from __future__ import annotations

import os
import sys
from typing import Any, cast

import torch
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view

from ckpt_ha.formats import checksum as cs

PIECE_BYTES = 1024 * 1024
"""A tensor is read and hashed in pieces of this size, each hashed just after it is read."""


class ShortRead(Exception):
    """The file ended before the tensor's bytes did."""


class FileHash:
    """One file's checksum taken in file order while its tensors are read into their targets:
    `catch_up` reads and hashes the bytes up to a position, `update` hashes bytes just read at
    the current one, `finish` hashes the rest of the file."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._hasher = cs.new_hasher(algorithm)
        self.position = 0
        self.broken = False
        self.result: tuple[str, int] | None = None
        """Set when a tensor could not be hashed in order: the file is read again instead."""

    def catch_up(self, fd: int, upto: int) -> None:
        while self.position < upto:
            data = os.pread(fd, min(PIECE_BYTES, upto - self.position), self.position)
            if not data:
                return  # the file ends here: `finish` counts what there was
            self.update(data)

    def update(self, data: bytes | memoryview) -> None:
        self._hasher.update(data)
        self.position += len(data)

    def finish(self, fd: int) -> tuple[str, int]:
        """(``algorithm:hex``, the file's size as read) once the whole file is hashed; kept
        in `result`."""
        while data := os.pread(fd, PIECE_BYTES, self.position):
            self.update(data)
        self.result = (f"{self.algorithm}:{self._hasher.hexdigest()}", self.position)
        return self.result


def _stored(view: Any) -> torch.Tensor | None:
    """The stored tensor's dtype, shape and layout, with no data read (None: not one tensor
    in this machine's byte order)."""
    reader: Any = torch._C.PyTorchFileReader(view)
    order = reader.get_record("byteorder") if reader.has_record("byteorder") else None
    if order is not None and order != sys.byteorder.encode():
        return None
    view.seek(0)
    stored = torch.load(view, map_location="meta", weights_only=True)
    return stored if isinstance(stored, torch.Tensor) else None


def _writable_bytes(target: torch.Tensor) -> memoryview | None:
    try:
        flat = target.reshape(-1).view(torch.uint8)
        return memoryview(cast(Any, flat.numpy())).cast("B")
    except (RuntimeError, TypeError, ValueError):
        return None


def read_in_place(stream: Any, offset: int, length: int, req: ReadItem,
                  planner: LoadPlanner, hashing: FileHash | None = None) -> bool:  # fmt: skip
    """Read ``req``'s stored tensor (at ``offset``, ``length`` bytes, in ``stream``) straight
    into its target and commit it, when the two match exactly; False (nothing read into the
    target, nothing hashed) when DCP's own read must do it. With ``hashing`` (at or before
    ``offset``), the file's bytes up to the tensor's end are hashed on the way. Raises
    `ShortRead` for a file that ends early."""
    if any(req.storage_offsets):
        return False
    view = _create_file_view(stream, offset, length)
    stored = _stored(view)
    if stored is None or tuple(stored.shape) != tuple(req.lengths):
        return False
    target = planner.resolve_tensor(req).detach()
    if (
        target.device.type != "cpu"
        or target.layout != torch.strided
        or stored.layout != torch.strided
        or target.dtype != stored.dtype
        or target.shape != stored.shape
        or not target.is_contiguous()
        or not stored.is_contiguous()
        or stored.storage_offset() != 0
        or stored.untyped_storage().nbytes() != stored.nbytes
    ):
        return False
    into = _writable_bytes(target)
    start: Any = getattr(stored.untyped_storage(), "_checkpoint_offset", None)
    if into is None or not isinstance(start, int) or start + len(into) > length:
        return False
    if hashing is not None:
        hashing.catch_up(stream.fileno(), offset + start)
        if hashing.position != offset + start:  # out of order, or the file ended early
            hashing.broken, hashing = True, None
    stream.seek(offset + start)
    filled = 0
    while filled < len(into):
        piece = into[filled : filled + PIECE_BYTES]
        n = stream.readinto(piece)
        if not n:
            raise ShortRead(f"{len(into) - filled} bytes of {req.storage_index.fqn} missing")
        if hashing is not None:
            hashing.update(piece[:n])
        filled += n
    planner.commit_tensor(req, target)
    return True
