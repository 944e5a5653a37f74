"""A two-rank gloo job for torchrun in which rank 1 fails the way argv[1] says; rank 0 waits
until torchrun ends the group.

``kill``: rank 1 SIGKILLs itself; ``exit``: rank 1 exits 3; ``raise``: rank 1 raises (torch
prefixes its traceback with ``[rank1]:``); ``record``: the same raise inside torchrun's
``@record``, which writes the traceback to the rank's error file.

The fixtures in tests/data/torchrun/ are this script's real runs, one per mode::

    TORCHELASTIC_ERROR_FILE=tests/data/torchrun/MODE.error.json \
        python -m torch.distributed.run --nproc_per_node 2 --nnodes 1 \
        tests/support/torchrun_rank_fault.py MODE 2> tests/data/torchrun/MODE.stderr
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "exit":
            sys.exit(3)
        raise ValueError(f"loss is nan at step {17 + dist.get_rank()}")
    time.sleep(60)


if __name__ == "__main__":
    (record(main) if sys.argv[1] == "record" else main)()
